"""Reading and writing benchmark result documents (JSON).

Every result is one JSON object with a ``kind`` (``"abbench"``, ``"sweep"``,
``"aiperf_crosscheck"``; a plain replay file has none) and a ``manifest``.
Request rows (any dict with an ``itl`` list) and lists of plain values are
written on one line each, the rest indented: small files, readable diffs.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict


def _dumps(obj: Any, indent: int) -> str:
    pad = " " * (indent + 1)
    if isinstance(obj, dict):
        if "itl" in obj or not obj:
            return json.dumps(obj, default=str)
        items = [f"{pad}{json.dumps(str(k))}: {_dumps(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(obj, (list, tuple)):
        if not obj or not any(isinstance(v, (dict, list, tuple)) for v in obj):
            return json.dumps(obj, default=str)
        items = [pad + _dumps(v, indent + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    return json.dumps(obj, default=str)


def dumps(doc: Dict[str, Any]) -> str:
    """The document as JSON text (see the module docstring for the layout)."""
    return _dumps(doc, 0) + "\n"


def write_json(path: str, doc: Dict[str, Any]) -> None:
    """Write ``doc`` to ``path``, creating the parent directory."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(dumps(doc))


def load_json(path: str) -> Dict[str, Any]:
    """Read a result document; a replay file without ``kind`` gets ``kind = "replay"``."""
    with open(path, "r", encoding="utf-8") as f:
        doc = json.load(f)
    doc.setdefault("kind", "replay")
    doc["_path"] = os.path.abspath(path)
    return doc
