"""Sharding rules, ring attention, FSDP gathers, sharded kernel calls and multi-process runs (8 CPU devices)."""
