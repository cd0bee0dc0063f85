"""The position of an item, when the caller names no function for it (the chunk loop, ``ctx.map``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["default_key"]


def default_key(item: Any) -> Any:
    """The position of an item: ``item["id"]`` for a mapping, ``item[0]`` for a row tuple, else the item."""
    if isinstance(item, Mapping):
        if "id" not in item:
            raise KeyError("the item has no 'id'; pass position=<function of an item> to ChunkedOperator")
        return item["id"]
    if isinstance(item, (tuple, list)):
        return item[0]
    return item
