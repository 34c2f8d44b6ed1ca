"""The offline code corpus: documented functions read from source, chats built from them, and the
line-overlap filter that keeps evaluation prompts out."""

from __future__ import annotations

import textwrap

import pytest

from hf_jetspec.training.code_corpus import code_chats, documented_functions, function_chat, overlaps, prompt_lines

SOURCE = textwrap.dedent('''
    def area(width, height):
        """Area of a rectangle of this width and height."""
        if width < 0 or height < 0:
            raise ValueError("negative side")
        return width * height


    def undocumented(x):
        return x + 1


    def _private(x):
        """Hidden."""
        return x


    class Shape:
        def scale(self, factor):
            """Scale every side by factor."""
            self.sides = [s * factor for s in self.sides]
            return self
''')


def test_documented_functions_and_methods_are_read(tmp_path):
    path = tmp_path / "shapes.py"
    path.write_text(SOURCE)
    fns = documented_functions(path, "shapes", min_lines=3)
    assert [f.name for f in fns] == ["area", "Shape.scale"]
    assert fns[0].header == 'def area(width, height):\n    """Area of a rectangle of this width and height."""\n'
    assert fns[1].source.startswith("def scale(self, factor):") and fns[1].source.endswith("return self\n")  # dedented
    assert documented_functions(path, "shapes", min_lines=5) == [fns[0]]  # scale has 4 lines
    (tmp_path / "broken.py").write_text("def f(:\n")
    assert documented_functions(tmp_path / "broken.py", "broken") == []


def test_function_chat_asks_for_the_header_and_answers_with_the_source(tmp_path):
    path = tmp_path / "shapes.py"
    path.write_text(SOURCE)
    fn = documented_functions(path, "shapes", min_lines=3)[0]
    user, answer = function_chat(fn)
    assert user["role"] == "user" and fn.header in user["content"] and "return width * height" not in user["content"]
    assert answer == {"role": "assistant", "content": f"```python\n{fn.source}```"}


def test_overlap_is_a_shared_long_line():
    lines = prompt_lines(["def below_zero(operations: List[int]) -> bool:\n    short line\n"], min_line_chars=30)
    assert lines == {"def below_zero(operations: List[int]) -> bool:"}
    assert overlaps([{"role": "user", "content": "  def below_zero(operations: List[int]) -> bool:  "}], lines)
    assert not overlaps([{"role": "user", "content": "short line"}], lines)


def test_code_chats_drop_overlapping_ones_and_record_licences():
    stats: dict = {}
    chats = list(code_chats(["package:hf_jetspec"], stats=stats))
    assert chats and stats["package:hf_jetspec"]["kept"] == len(chats)
    first_line = chats[0][1]["content"].splitlines()[1]
    stats2: dict = {}
    again = list(code_chats(["package:hf_jetspec"], exclude=[first_line], min_line_chars=10, stats=stats2))
    assert len(again) < len(chats) and stats2["package:hf_jetspec"]["overlapping"] >= 1
    with pytest.raises(ValueError, match="unknown code source"):
        list(code_chats(["nowhere"]))
