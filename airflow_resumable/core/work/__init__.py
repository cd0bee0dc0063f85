"""The work loops above one attempt: the chunk loop, and partitioned jobs."""
