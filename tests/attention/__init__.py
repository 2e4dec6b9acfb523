"""Dense, varlen and broadcast-query attention: reference, kernel paths, backward, Blackwell emulation."""
