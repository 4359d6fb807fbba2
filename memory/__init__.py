"""Memory layer: code-aware chunking, a persistent vector store, SOP procedural memory, ingestion and
prompt assembly. NumPy and plain Python; no JAX training code (fineflax/) is imported."""
