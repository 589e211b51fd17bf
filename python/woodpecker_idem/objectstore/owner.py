"""The owner marker: one metadata store per object-store root, and one root per metadata store.

Log ids are numbered by each metadata store, so two stores writing below one root would put two
different logs under the same keys. Every store therefore keeps its objects under its identity
(`{root}/{store_id}/...`), and `claim_root` records, create-if-absent, which store owns the root
(`{root}/OWNER`): a second metadata store pointed at the same root is refused with a message that
says what to change, instead of silently sharing the bucket.

The other direction: the metadata store records where its objects live (`objects_location`, the
bucket and root, recorded once) and `check_binding` refuses a client of that store pointed at
another root. Its writer would find none of the log's objects there, complete the current segment
as empty and seal it in the shared metadata, while the real writer, fenced only in the other root,
went on acknowledging writes that no reader would ever see.
"""

from __future__ import annotations

import json
import logging

from ..errors import ObjectStoreOwnedError, StorageUnavailableError
from .base import ObjectStore

log = logging.getLogger(__name__)

OWNER_KEY = "OWNER"
_FORMAT = 1


def owner_marker(store_id: str) -> bytes:
    """The marker's bytes: small JSON, so an operator can read who owns a root."""
    return json.dumps({"format": _FORMAT, "store_id": store_id}, sort_keys=True).encode()


def read_owner(data: bytes) -> str | None:
    """The store id a marker names, or None if `data` is not an owner marker."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    owner = doc.get("store_id") if isinstance(doc, dict) else None
    return owner if isinstance(owner, str) and owner else None


def claim_root(root: ObjectStore, store_id: str, where: str, meta: str) -> ObjectStore:
    """Record or check the owner marker at the top of `root`; return the store for `store_id`'s
    objects. `where` names the root and `meta` the metadata store, for the error message.

    Read first, so a client of a read-only data directory that the store owns writes nothing."""
    data = root.get(OWNER_KEY)
    if data is None:
        if root.put(OWNER_KEY, owner_marker(store_id), if_none_match=True):
            log.info("object store %s: claimed for metadata store %s (%s)", where, store_id, meta)
            return root.child(store_id)
        data = root.get(OWNER_KEY)  # another store's client won the race
        if data is None:  # and the marker was deleted again since: nobody owns it now
            raise StorageUnavailableError(
                f"object store {where}: the owner marker {OWNER_KEY} vanished while being "
                "checked; connect again"
            )
    owner = read_owner(data)
    if owner == store_id:
        return root.child(store_id)
    found = f"metadata store {owner}" if owner else f"something else ({OWNER_KEY} is not ours)"
    raise ObjectStoreOwnedError(
        f"object store {where} belongs to {found}, not to this metadata store {store_id} "
        f"({meta}). Two metadata stores on one bucket and root would mix up their logs. Set "
        "a different objectstore.root for this one, or point meta at the metadata store that "
        "owns the root (the same meta.path, or meta.type: etcd shared by every host)"
    )


def objects_location(kind: str, bucket: str | None, root: str) -> str:
    """How a metadata store names the place of its objects: the bucket and root for S3; the root
    for a local directory (whose path moves with the data directory, so it is not part of it)."""
    root = root.strip("/")
    return f"s3://{bucket}/{root}" if kind == "s3" else f"local:{root}"


def check_binding(location: str, bound: str | None, store_id: str, meta: str) -> None:
    """`ObjectStoreOwnedError` if the metadata store's objects live elsewhere than `location`."""
    if bound is None or bound == location:
        return
    raise ObjectStoreOwnedError(
        f"metadata store {store_id} ({meta}) keeps its objects at {bound}, not at {location}: "
        "every client of one metadata store must use the same objectstore.bucket and "
        f"objectstore.root (a writer on another root would find the log's segments empty there "
        "and seal them so, losing the acknowledged writes of the writer on the right root). Set "
        "them to the recorded place, or use another metadata store (another meta.prefix or "
        "meta.path) for the other root"
    )
