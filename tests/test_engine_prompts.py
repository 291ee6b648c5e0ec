"""The prompts file of `ppscope run --prompts`: read exactly as written, or refused in one line naming the line."""

from __future__ import annotations

from pathlib import Path

import pytest
from error_helpers import cli_error, raises_code

from ppscope.engine.requests import load_prompts
from ppscope.errors import ErrorCode, InvalidConfigError

VOCAB = 100


def _load(tmp_path: Path, content: str | bytes, max_len: int | None = None) -> list[tuple[list[int], int]]:
    path = tmp_path / "p.jsonl"
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    requests = load_prompts(path, VOCAB, 8) if max_len is None else load_prompts(path, VOCAB, 8, max_len=max_len)
    return [(r.prompt_ids, r.max_new_tokens) for r in requests]


def _refused(
    tmp_path: Path, content: str | bytes, *, max_len: int | None = None, code: ErrorCode = ErrorCode.BAD_PROMPTS
) -> str:
    """The message of the refusal, which has `code`: tests check what it names (the file and line, the key, the
    value), not its words."""
    with raises_code(InvalidConfigError, code) as exc:
        _load(tmp_path, content, max_len)
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_valid_file_is_read_as_written(tmp_path: Path) -> None:
    content = '{"prompt_ids": [1, 2, 99], "max_new_tokens": 3}\r\n\n  \n{"max_new_tokens": 1, "prompt_ids": [0]}\n'
    assert _load(tmp_path, content) == [([1, 2, 99], 3), ([0], 1)]
    assert _load(tmp_path, '{"prompt_ids": [5]}') == [([5], 8)]  # the default max_new_tokens


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    assert _load(tmp_path, '\ufeff{"prompt_ids": [1, 2], "max_new_tokens": 2}\n') == [([1, 2], 2)]


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (b'\xff\xfe{\x00"\x00', 1),  # UTF-16
        (b'{"prompt_ids": [1]}\n{"prompt_ids": [2]}\n{"prompt_ids": [3]} \xe9\n', 3),  # Latin-1
    ],
)
def test_text_that_is_not_utf8_names_the_line(tmp_path: Path, content: bytes, line: int) -> None:
    assert f"p.jsonl:{line}:" in _refused(tmp_path, content)


@pytest.mark.parametrize(
    ("line", "key", "shown"),
    [
        ('{"prompt_ids": [1, Infinity]}', '"prompt_ids"[1]', "Infinity"),
        ('{"prompt_ids": [NaN]}', '"prompt_ids"[0]', "NaN"),
        ('{"prompt_ids": [1], "max_new_tokens": 1e400}', '"max_new_tokens"', "Infinity"),
        ('{"prompt_ids": "123"}', '"prompt_ids"', '"123"'),
        ('{"prompt_ids": {"5": 1, "6": 2}}', '"prompt_ids"', '{"5": 1, "6": 2}'),
        ('{"prompt_ids": [true, false]}', '"prompt_ids"[0]', "true"),
        ('{"prompt_ids": [1.7, 2.2]}', '"prompt_ids"[0]', "1.7"),
        ('{"prompt_ids": [3, 2.0]}', '"prompt_ids"[1]', "2.0"),
        ('{"prompt_ids": ["1", "2"]}', '"prompt_ids"[0]', '"1"'),
        ('{"prompt_ids": []}', '"prompt_ids"', "[]"),
        ('{"prompt_ids": [1], "max_new_tokens": 2.9}', '"max_new_tokens"', "2.9"),
        ('{"prompt_ids": [1], "max_new_tokens": "2"}', '"max_new_tokens"', '"2"'),
        ('{"prompt_ids": [1], "max_new_tokens": true}', '"max_new_tokens"', "true"),
        ('{"prompt_ids": [1], "max_new_tokens": null}', '"max_new_tokens"', "null"),
        ('{"prompt_ids": [1], "max_new_tokens": 0}', '"max_new_tokens"', "0"),
    ],
)
def test_a_value_that_is_not_an_integer_is_refused(tmp_path: Path, line: str, key: str, shown: str) -> None:
    message = _refused(tmp_path, '{"prompt_ids": [4]}\n' + line + "\n")
    assert message.startswith(f"{tmp_path / 'p.jsonl'}:2:") and key in message and shown in message, message


def test_an_unknown_key_is_refused_with_the_valid_ones(tmp_path: Path) -> None:
    message = _refused(tmp_path, '{"prompt_ids": [1, 2], "max_tokens": 2}\n')
    assert "p.jsonl:1:" in message and '"max_tokens"' in message
    assert '"prompt_ids", "max_new_tokens"' in message  # the valid ones


def test_a_repeated_key_is_refused(tmp_path: Path) -> None:
    message = _refused(tmp_path, '{"prompt_ids": [1], "prompt_ids": [2, 3]}\n')
    assert "p.jsonl:1:" in message and '"prompt_ids"' in message


@pytest.mark.parametrize(("line", "shown"), [("[1, 2]", "[1, 2]"), ("{prompt_ids: [1]}", "")])
def test_a_line_that_is_not_an_object_is_refused(tmp_path: Path, line: str, shown: str) -> None:
    message = _refused(tmp_path, line)
    assert "p.jsonl:1:" in message and shown in message  # the line, and what it holds instead


def test_a_token_id_outside_the_vocabulary_is_named(tmp_path: Path) -> None:
    message = _refused(tmp_path, '{"prompt_ids": [1, 2]}\n{"prompt_ids": [3, 4, 100, 5]}\n')
    assert all(name in message for name in ("p.jsonl:2:", '"prompt_ids"[2]', "100", f"[0, {VOCAB})")), message
    message = _refused(tmp_path, '{"prompt_ids": [-1]}')
    assert '"prompt_ids"[0]' in message and "-1" in message


def test_a_request_longer_than_the_model_names_its_line(tmp_path: Path) -> None:
    content = '{"prompt_ids": [1, 2]}\n{"prompt_ids": [1, 2, 3], "max_new_tokens": 8}\n'
    assert len(_load(tmp_path, content, max_len=11)) == 2
    message = _refused(tmp_path, content, max_len=10, code=ErrorCode.SEQUENCE_TOO_LONG)
    assert all(name in message for name in ("p.jsonl:2:", '"max_new_tokens"', "11", "10")), message  # the sizes
    message = _refused(tmp_path, '{"prompt_ids": [1, 2, 3]}\n', max_len=10, code=ErrorCode.SEQUENCE_TOO_LONG)
    assert "--max-new-tokens" in message and '"max_new_tokens"' not in message  # where the 8 came from


def test_a_directory_is_named_as_one(tmp_path: Path) -> None:
    with raises_code(InvalidConfigError, ErrorCode.BAD_PROMPTS):
        load_prompts(tmp_path, VOCAB, 8)


def test_run_refuses_a_bad_prompts_file_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [1, 2], "max_tokens": 2}\n')
    args = ["--model", "synthetic", "--layers", "2", "--layer-cost-ms", "0", "--stages", "1", "--no-progress"]
    failed = cli_error(capsys, ["run", *args, "--prompts", str(prompts), "--out", str(tmp_path / "run")])
    assert failed.exit_code == 2 and failed.code == ErrorCode.BAD_PROMPTS
    assert failed.err.count("\n") == 1 and "Traceback" not in failed.err
    assert failed.text.startswith(f"{prompts}:1:") and '"max_tokens"' in failed.text  # the file, line and key
    assert not (tmp_path / "run").exists()
