//! A client and a server of this module over loopback: bytes through both ways, a handler's
//! failure with its project error code, an unknown method, deadlines, a stopped server.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tonic::Code;

use super::client::NodeChannel;
use super::server::{Handler, NodeServer};
use super::{code_by_name, code_name, Failure};

struct Echo;

impl Handler for Echo {
    fn handle(&self, method: &str, body: Bytes) -> Result<Bytes, Failure> {
        match method {
            "Echo" => Ok(body),
            "Fail" => Err(Failure {
                code: Code::Aborted,
                message: "refused".to_owned(),
                error: Some("SEGMENT_FENCED".to_owned()),
            }),
            "Slow" => {
                std::thread::sleep(Duration::from_millis(300));
                Ok(body)
            }
            _ => Err(Failure::new(Code::Unimplemented, method.to_owned())),
        }
    }
}

fn serve() -> (NodeServer, NodeChannel) {
    let server = NodeServer::bind("127.0.0.1:0", "t.S", Arc::new(Echo), None, 4).unwrap();
    let address = format!("127.0.0.1:{}", server.port());
    (server, NodeChannel::new(&address, "t.S", None).unwrap())
}

#[test]
fn bytes_cross_both_ways_unchanged() {
    let (server, channel) = serve();
    let big: Vec<u8> = (0..5_000_000u32).map(|i| (i % 251) as u8).collect();
    for body in [Bytes::new(), Bytes::from_static(b"x"), Bytes::from(big)] {
        let answer = channel
            .call("Echo", body.clone(), Duration::from_secs(10))
            .unwrap();
        assert_eq!(answer, body);
    }
    server.stop(Duration::ZERO);
}

#[test]
fn a_handler_failure_carries_its_status_and_error_code() {
    let (server, channel) = serve();
    let failure = channel
        .call("Fail", Bytes::new(), Duration::from_secs(10))
        .unwrap_err();
    assert_eq!(failure.code, Code::Aborted);
    assert_eq!(failure.message, "refused");
    assert_eq!(failure.error.as_deref(), Some("SEGMENT_FENCED"));
    let unknown = channel
        .call("Nope", Bytes::new(), Duration::from_secs(10))
        .unwrap_err();
    assert_eq!(unknown.code, Code::Unimplemented);
    let other = NodeChannel::new(&format!("127.0.0.1:{}", server.port()), "t.Other", None).unwrap();
    let wrong = other
        .call("Echo", Bytes::new(), Duration::from_secs(10))
        .unwrap_err();
    assert_eq!(wrong.code, Code::Unimplemented);
    assert_eq!(wrong.error, None);
    server.stop(Duration::ZERO);
}

#[test]
fn a_call_past_its_deadline_fails_and_the_channel_goes_on() {
    let (server, channel) = serve();
    let late = channel
        .call("Slow", Bytes::new(), Duration::from_millis(50))
        .unwrap_err();
    assert_eq!(late.code, Code::DeadlineExceeded);
    let answer = channel.call("Echo", Bytes::from_static(b"y"), Duration::from_secs(10));
    assert_eq!(answer.unwrap(), Bytes::from_static(b"y"));
    server.stop(Duration::ZERO);
}

#[test]
fn a_stopped_server_is_unavailable_and_a_new_one_is_reached_again() {
    let (server, channel) = serve();
    let port = server.port();
    channel
        .call("Echo", Bytes::new(), Duration::from_secs(10))
        .unwrap();
    server.stop(Duration::from_secs(5));
    let down = channel
        .call("Echo", Bytes::new(), Duration::from_secs(10))
        .unwrap_err();
    assert_eq!(down.code, Code::Unavailable, "{down:?}");
    assert_eq!(channel.failures(), 1); // the next try waits for the backoff
    let again = NodeServer::bind(&format!("127.0.0.1:{port}"), "t.S", Arc::new(Echo), None, 4);
    let again = again.unwrap();
    let answer = loop {
        match channel.call("Echo", Bytes::from_static(b"z"), Duration::from_secs(10)) {
            Ok(answer) => break answer,
            Err(f) => assert_eq!(f.code, Code::Unavailable, "{f:?}"), // until the next try
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(answer, Bytes::from_static(b"z"));
    assert_eq!(channel.failures(), 0); // reached: the backoff starts over
    again.stop(Duration::ZERO);
}

#[test]
fn the_reconnect_backoff_doubles_from_100_ms_to_1_s() {
    let mut reconnect = super::client::Reconnect::default();
    let now = std::time::Instant::now();
    let waits: Vec<u128> = (0..7)
        .map(|_| {
            reconnect.failed(now);
            (reconnect.next_try.unwrap() - now).as_millis()
        })
        .collect();
    assert_eq!(waits, [100, 200, 400, 800, 1000, 1000, 1000]);
}

#[test]
fn status_names_are_grpcs() {
    assert_eq!(code_name(Code::Unavailable), "UNAVAILABLE");
    assert_eq!(code_by_name("DATA_LOSS"), Some(Code::DataLoss));
    assert_eq!(code_by_name("unavailable"), None);
}

#[test]
fn outcomes_go_in_arrival_order_and_close_returns_the_consumer() {
    use super::completions::Completions;
    let queue = Arc::new(Completions::default());
    queue.push((1, Ok(Bytes::new())));
    queue.push((2, Err(Failure::new(Code::Unavailable, "down"))));
    assert_eq!(queue.next().map(|o| o.0), Some(1));
    assert_eq!(
        queue.next().map(|o| o.1.unwrap_err().code),
        Some(Code::Unavailable)
    );
    let consumer = {
        let queue = queue.clone();
        std::thread::spawn(move || queue.next().is_none())
    };
    queue.close();
    assert!(consumer.join().unwrap());
    queue.push((3, Ok(Bytes::new()))); // dropped: closed
    assert!(queue.next().is_none());
}
