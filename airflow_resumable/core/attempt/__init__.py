"""One attempt's life: acquire the lease, run the handler, save after each chunk, finish; its context, signal and lease."""
