"""No function over 80 lines and no module over 500 in pmc/ and adapters/ (the style
guide's limits); ``python tests/longest.py`` lists the longest."""

from __future__ import annotations

import longest


def test_no_function_over_the_limit() -> None:
    over = [f"{n} lines: {where}" for n, where in longest.functions()
            if n > longest.FUNCTION_LIMIT]
    assert not over, "split these functions:\n" + "\n".join(over)


def test_no_module_over_the_limit() -> None:
    over = [f"{n} lines: {where}" for n, where in longest.modules() if n > longest.MODULE_LIMIT]
    assert not over, "split these modules:\n" + "\n".join(over)


def test_the_script_prints_both_lists(capsys) -> None:  # type: ignore[no-untyped-def]
    assert longest.main(["3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("longest functions") and out[4].startswith("longest modules")
    assert len(out) == 8
