"""Builds data/multi/ from the shared data pack's multi/ folder, smaller for the repository.

    python data/scripts/subsample_multi.py /path/to/shared/data/multi data/multi

Bibles: every 4th verse (line index % 4 == 0). UDHR: every translation, cut to
its first 3,000 characters (at a line end). Output is gzip with mtime 0, so the
files are byte-for-byte reproducible.
"""

import gzip
import io
import json
import pathlib
import sys

UDHR_CHARS = 3000


def write_gz(path: pathlib.Path, text: str) -> None:
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        f.write(text.encode("utf-8"))


def main(src: str, dst: str) -> None:
    src_dir, dst_dir = pathlib.Path(src), pathlib.Path(dst)
    dst_dir.mkdir(parents=True, exist_ok=True)
    for name in ("spa_rv1909_bible.txt.gz", "jpn_kougo_bible.txt.gz"):
        lines = gzip.open(src_dir / name, "rt", encoding="utf-8").read().splitlines()
        write_gz(dst_dir / name.replace("_bible", "_bible_every4th"),
                 "".join(line + "\n" for i, line in enumerate(lines) if i % 4 == 0))
    out = io.StringIO()
    for line in gzip.open(src_dir / "udhr.jsonl.gz", "rt", encoding="utf-8"):
        record = json.loads(line)
        text = record["text"]
        if len(text) > UDHR_CHARS:
            text = text[:text.rfind("\n", 0, UDHR_CHARS)] if "\n" in text[:UDHR_CHARS] else text[:UDHR_CHARS]
        record["text"] = text
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
    write_gz(dst_dir / "udhr_3k.jsonl.gz", out.getvalue())


if __name__ == "__main__":
    main(*sys.argv[1:3])
