"""Write servlens/schemas/KIND.schema.json from the TypedDicts in servlens/documents.py.

    python tools/make_schemas.py          # after changing a document type; tests/test_documents.py checks it
"""

from __future__ import annotations

import json
from pathlib import Path

from servlens.documents import KINDS, schema_from_types

SCHEMAS = Path(__file__).resolve().parent.parent / "servlens" / "schemas"


def schema_text(kind: str) -> str:
    return json.dumps(schema_from_types(kind), indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    for kind in KINDS:
        (SCHEMAS / f"{kind}.schema.json").write_text(schema_text(kind), encoding="utf-8")
        print(f"wrote servlens/schemas/{kind}.schema.json")


if __name__ == "__main__":
    main()
