"""normalize_code, which works on distinct values, against value-by-value normalization."""

import numpy as np
import pandas as pd
import pytest

from gedp.errors import InputError
from gedp.synth.schema import code_text, normalize_code


def value_by_value(values, width: int) -> list[str]:
    """Each code normalized on its own: stripped text, or a non-negative whole number zero-padded."""
    out = []
    for value in values:
        text = str(value).strip() if isinstance(value, str) else f"{int(value):0{width}d}"
        assert len(text) == width and text.isascii() and text.isdigit()
        out.append(text)
    return out


@pytest.mark.parametrize("dtype", ["str", "object", "int64", "Int64"])
def test_codes_are_normalized_as_one_by_one(dtype):
    rng = np.random.default_rng(4)
    numbers = rng.choice([1, 5, 13, 44, 120, 999], 400)
    values = numbers if "nt" in dtype else [f" {n:03d}" if n % 2 else f"{n:03d} " for n in numbers]
    frame = pd.DataFrame({"county": pd.Series(values, dtype=dtype, index=np.arange(400) + 7)})
    result = normalize_code(frame, "county", 3)
    assert result.tolist() == value_by_value(values, 3)
    assert result.index.equals(frame.index) and result.name == "county"
    reference, _ = code_text(frame["county"], 3)
    pd.testing.assert_series_equal(result, reference.astype(str))


@pytest.mark.parametrize("dtype", ["str", "int64", "object"])
def test_the_first_malformed_row_is_named(dtype):
    values = ["44", "44", "4", "09", "4"] if dtype != "int64" else [44, 44, -4, 9, -4]
    frame = pd.DataFrame({"estab_id": ["a", "b", "c", "d", "e"], "state": pd.Series(values, dtype=dtype)})
    expected = r"column 'state': codes must be 2 ASCII digits; first at row 3 \(estab_id c\)"
    with pytest.raises(InputError, match=expected):
        normalize_code(frame, "state", 2)


def test_a_missing_code_is_malformed():
    frame = pd.DataFrame({"estab_id": ["a", "b"], "own": pd.Series(["5", None], dtype="str")})
    with pytest.raises(InputError, match=r"first at row 2 \(estab_id b\)"):
        normalize_code(frame, "own", 1)
