"""Generated from proto/ by scripts/protos (messages only; do not edit: regenerate)."""
