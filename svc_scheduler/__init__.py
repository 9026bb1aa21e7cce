"""svc_scheduler: the front door; embedding-based routing with Redis and FAISS (R9-R12)."""
