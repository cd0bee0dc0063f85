"""``ctx.transaction()``: the handle the handler borrows, and the verdict on each statement it sends."""
