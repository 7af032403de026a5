"""Every ```python block in README.md and docs/ runs as written, each in a fresh interpreter.

A block runs from the repository root in its own subprocess, with a timeout, and passes when it
exits with status 0; a failure names the file and line of the block and shows its output. A block
that cannot run on a machine without a GPU (it needs a GPU, or it is not a program) says why in an
HTML comment on the line above its fence::

    <!-- no-run: needs a GPU -->

Such a block must still compile; one whose reason starts with "needs a GPU" runs as a test marked
``gpu`` where a GPU backend is usable. At most one block in five may be a no-run block. Blocks in
other languages (sh, text, cpp) are not run. On a GPU machine ``open_runtime("auto")`` in a block
picks the GPU, so the GPU suite runs the examples there too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 180  # per block; generous: CI's two cores are shared with the rest of the suite
NO_RUN = re.compile(r"^<!--\s*no-run:\s*(?P<reason>.+?)\s*-->$")
FENCE = re.compile(r"^(?P<indent> *)(?P<ticks>`{3,}|~{3,})(?P<info>[^`]*)$")
GPU_REASON = "needs a GPU"


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    code: str
    no_run: str | None  # the reason given on the line above the fence, if any

    @property
    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks(path: Path) -> list[Block]:
    """The ```python blocks of one Markdown file, dedented by their fence's indentation."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, ticks = opening["indent"], opening["ticks"]
        end = i + 1
        while end < len(lines) and not (lines[end].strip().startswith(ticks) and not lines[end].strip().strip(ticks[0])):
            end += 1
        if end == len(lines):
            raise ValueError(f"{path}:{i + 1}: code fence never closed")
        if opening["info"].split()[:1] == ["python"]:
            body = [ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : end]]
            above = NO_RUN.match(lines[i - 1].strip()) if i > 0 else None
            blocks.append(Block(path, i + 1, "\n".join(body) + "\n", above["reason"] if above else None))
        i = end + 1
    return blocks


def run_block(block: Block, cwd: Path = ROOT) -> None:
    """Run one block in a fresh interpreter; ``pytest.fail`` with its place and output unless it exits 0."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / f"{block.path.stem}_{block.line}.py"
        # Blank lines in front keep a traceback's line numbers equal to the Markdown file's.
        script.write_text("\n" * block.line + block.code, encoding="utf-8")
        try:
            proc = subprocess.run(
                [sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
            pytest.fail(f"{block.where}: still running after {TIMEOUT_S} s\n--- stdout\n{out}", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(
            f"{block.where}: exit status {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}",
            pytrace=False,
        )


BLOCKS = [b for path in doc_files() for b in python_blocks(path)]


def _runnable() -> list[object]:
    params: list[object] = []
    for b in BLOCKS:
        if b.no_run is None:
            params.append(pytest.param(b, id=b.where))
        elif b.no_run.startswith(GPU_REASON):
            params.append(pytest.param(b, id=b.where, marks=pytest.mark.gpu))
    return params


def test_blocks_found() -> None:
    assert len(BLOCKS) >= 25, [b.where for b in BLOCKS]  # the docs' examples were not lost


def test_no_run_blocks_are_few_and_compile() -> None:
    no_run = [b for b in BLOCKS if b.no_run is not None]
    assert 5 * len(no_run) <= len(BLOCKS), f"{len(no_run)} of {len(BLOCKS)} blocks are no-run: {[b.where for b in no_run]}"
    for b in no_run:
        compile(b.code, b.where, "exec")


@pytest.mark.slow
@pytest.mark.parametrize("block", _runnable())
def test_block_runs(block: Block) -> None:
    run_block(block)


# -- the runner itself ----------------------------------------------------------------------------

SAMPLE = """\
# Title

```python
print("top")
```

<!-- no-run: needs a GPU -->
```python
import streamrt
```

```sh
echo not python
```

1. A list item:

   ```python
   if True:
       print("indented")
   ```

~~~python title="x"
print("tilde")
~~~
"""


def test_parser_finds_python_blocks_with_their_lines_and_reasons(tmp_path: Path) -> None:
    doc = tmp_path / "sample.md"
    doc.write_text(SAMPLE, encoding="utf-8")
    blocks = python_blocks(doc)
    assert [(b.line, b.no_run) for b in blocks] == [(3, None), (8, "needs a GPU"), (18, None), (23, None)]
    assert blocks[2].code == 'if True:\n    print("indented")\n'
    assert blocks[3].code == 'print("tilde")\n'


def test_parser_refuses_an_unclosed_fence(tmp_path: Path) -> None:
    doc = tmp_path / "broken.md"
    doc.write_text("```python\nprint(1)\n", encoding="utf-8")
    with pytest.raises(ValueError, match="broken.md:1: code fence never closed"):
        python_blocks(doc)


def test_a_failing_block_reports_its_place_and_output(tmp_path: Path) -> None:
    block = Block(tmp_path / "guide.md", 7, 'print("before")\nraise SystemExit("boom")\n', None)
    with pytest.raises(pytest.fail.Exception) as info:
        run_block(block, cwd=tmp_path)
    message = str(info.value)
    assert f"{tmp_path / 'guide.md'}:7: exit status 1" in message
    assert "before" in message and "boom" in message


def test_a_passing_block_runs_from_the_given_directory(tmp_path: Path) -> None:
    block = Block(tmp_path / "guide.md", 1, 'import os, pathlib; pathlib.Path("ran").write_text(os.getcwd())\n', None)
    run_block(block, cwd=tmp_path)
    assert (tmp_path / "ran").read_text() == str(tmp_path)
