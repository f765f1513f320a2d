"""megatron-core's training stack on our side (see the package face commit)."""
