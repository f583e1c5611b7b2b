"""One establishment, one id: integer, floating-point, decimal, binary and text ids of the same
establishments are the same ids in a release and the same accounts in the lifetime ledger; ids that
are not text or whole numbers are refused without echoing them."""

import decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gedp.accounting.ledger_file import establishment_keys
from gedp.cli import app
from gedp.errors import InputError
from gedp.synth.schema import canonical_ids, validate_microdata

runner = CliRunner()
FIRST_ID = 1000


@pytest.fixture
def records(small_state):
    """400 establishments with integer ids FIRST_ID, FIRST_ID + 1, ..."""
    frame = small_state.head(400).copy()
    frame["estab_id"] = np.arange(FIRST_ID, FIRST_ID + len(frame), dtype=np.int64)
    return frame


def as_ids(frame: pd.DataFrame, kind: str) -> pa.Table:
    """``frame`` as an Arrow table whose estab_id column is of ``kind``."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    ids = frame["estab_id"].to_numpy()
    column = {"int": pa.array(ids), "float": pa.array(ids.astype(np.float64)),
              "decimal": pa.array([decimal.Decimal(f"{i}.00") for i in ids], type=pa.decimal128(12, 2)),
              "binary": pa.array([str(i).encode() for i in ids], type=pa.binary())}[kind]
    return table.set_column(table.schema.get_field_index("estab_id"), "estab_id", column)


def protect(source, out, ledger, *extra):
    return runner.invoke(app, ["protect", str(source), "--config", "employment", "--out", str(out),
                               "--ledger", str(ledger), *map(str, extra)])


@pytest.mark.parametrize("kind", ["float", "decimal", "binary", "csv text"])
def test_same_establishments_under_another_id_type_draw_on_the_same_accounts(tmp_path, records, kind):
    """cap 3, employment's charge 2.28 per release: once is admitted, twice is over the cap (3.2 > 3)
    whatever type the second file's ids are."""
    first = tmp_path / "int.parquet"
    pq.write_table(as_ids(records, "int"), first)
    ledger = tmp_path / "ledger.json"
    admitted = protect(first, tmp_path / "r1", ledger, "--lifetime-cap", 3)
    assert admitted.exit_code == 0, admitted.output
    if kind == "csv text":
        second = tmp_path / "again.csv"
        records.assign(estab_id=records["estab_id"].astype(float)).to_csv(second, index=False)
        assert f"{FIRST_ID}.0," in second.read_text()  # the ids as a float column writes them
    else:
        second = tmp_path / f"{kind}.parquet"
        pq.write_table(as_ids(records, kind), second)
    refused = protect(second, tmp_path / "r2", ledger, "--lifetime-cap", 3)
    assert refused.exit_code == 2, refused.output
    assert "over their lifetime cap" in refused.output
    assert not (tmp_path / "r2").exists()


def test_a_release_writes_one_id_whatever_the_type(tmp_path, records):
    """The float-id input's release is the int-id input's, byte for byte."""
    releases = {}
    for kind in ("int", "float"):
        source = tmp_path / f"{kind}.parquet"
        pq.write_table(as_ids(records, kind), source)
        out = tmp_path / kind
        result = runner.invoke(app, ["protect", str(source), "--config", "employment", "--out", str(out),
                                     "--seed", "5", "--not-for-publication"])
        assert result.exit_code == 0, result.output
        releases[kind] = out
    assert "read as its whole number" in result.output  # the float ids' note
    files = sorted(p.relative_to(releases["int"]) for p in releases["int"].rglob("*") if p.is_file())
    assert files
    for name in files:
        if name.name != "manifest.json":
            assert (releases["int"] / name).read_bytes() == (releases["float"] / name).read_bytes(), name
    ids = pd.read_parquet(releases["float"] / "protected.parquet")["estab_id"]
    assert set(ids) == {str(i) for i in records["estab_id"]}


@pytest.mark.parametrize("ids, expected", [
    (pd.Series([1002, 7], dtype="int64"), ["1002", "7"]),
    (pd.Series([1002, 7], dtype="uint16"), ["1002", "7"]),
    (pd.Series([1002.0, 7.0]), ["1002", "7"]),
    (pd.Series([2.0**53 - 1]), ["9007199254740991"]),
    (pd.Series(["1002.0", " 17.00 ", "7.", "A1.0", "12.5", "0012"]), ["1002", "17", "7", "A1.0", "12.5", "0012"]),
    (pd.Series([decimal.Decimal("1002.00"), decimal.Decimal("3")]), ["1002", "3"]),
    (pd.Series([b"1002", b"x1"]), ["1002", "x1"]),
    (pd.Series(["1002.0", "b"], dtype="category"), ["1002", "b"]),
    (pd.Series(["a", "b"], dtype="string"), ["a", "b"]),
])
def test_canonical_ids(ids, expected):
    assert canonical_ids(ids).tolist() == expected


@pytest.mark.parametrize("ids, rule", [
    (pd.Series([5.0, 1002.5]), "floating-point ids must be whole numbers below 2\\*\\*53.*first at row 2"),
    (pd.Series([2.0**53]), "below 2\\*\\*53.*first at row 1"),
    (pd.Series([np.inf]), "below 2\\*\\*53.*first at row 1"),
    (pd.Series([decimal.Decimal("3"), decimal.Decimal("1002.5")]), "decimal ids must be whole numbers; first at row 2"),
    (pd.Series([b"ok", b"\xff1002"]), "binary ids must be UTF-8 text; first at row 2"),
    (pd.Series([True, False]), "not booleans"),
    (pd.Series(pd.to_datetime(["2016-01-01"])), "not dates or times"),
    (pd.Series([1002, "x"], dtype=object), "not a mix of types"),
])
def test_ids_that_are_not_text_or_whole_numbers_are_refused_without_their_value(ids, rule):
    with pytest.raises(InputError, match=f"column 'estab_id': ids must be text or whole numbers.*{rule}") as caught:
        canonical_ids(ids)
    assert "1002" not in str(caught.value)


def test_validation_and_ledger_keys_agree_across_types(small_state):
    frame = small_state.head(50).copy()
    frame["estab_id"] = np.arange(7, 57)
    key = "0123456789abcdef"
    texts = validate_microdata(frame)["estab_id"]
    for ids in (frame["estab_id"], frame["estab_id"].astype(float), frame["estab_id"].astype(str) + ".0"):
        assert validate_microdata(frame.assign(estab_id=ids))["estab_id"].tolist() == texts.tolist()
        assert np.array_equal(establishment_keys(ids, key), establishment_keys(texts, key))


@pytest.mark.parametrize("prefix, repeat", [("", "{}.0"), ("A", "0a{}")], ids=["with a point", "as an account"])
def test_a_repeated_id_under_two_spellings_is_found_on_intake(tmp_path, records, prefix, repeat):
    """The first check of a CSV file finds row 10 spelling row 4's id with a point, or with a leading zero in
    lower case (the ledger's account rule), and names rows, never the id."""
    frame = records.assign(estab_id=[f"{prefix}{i}" for i in records["estab_id"]])
    frame.loc[frame.index[9], "estab_id"] = repeat.format(FIRST_ID + 3)
    path = tmp_path / "in.csv"
    frame.to_csv(path, index=False)
    result = runner.invoke(app, ["protect", str(path), "--config", "employment", "--out", str(tmp_path / "r"),
                                 "--seed", "1", "--not-for-publication"])
    assert result.exit_code == 2, result.output
    assert "ids repeating an earlier row's at row 10" in result.output
    assert str(FIRST_ID + 3) not in result.output


def test_canonical_ids_keep_each_row_in_its_place():
    """A selection of rows (the ledger's ids of one quarter) keeps its index: each id stays on its row."""
    ids = pd.Series(["1002.0", "x", "7.00", "8"], index=[10, 5, 3, 99], name="estab_id")
    assert canonical_ids(ids).to_dict() == {10: "1002", 5: "x", 3: "7", 99: "8"}
    floats = pd.Series([3.0, 4.0], index=[7, 9])
    assert canonical_ids(floats).to_dict() == {7: "3", 9: "4"}


def test_ledger_keys_of_quarters_of_float_text_ids():
    from gedp.accounting.ledger_spending import keys_by_quarter

    key = "0123456789abcdef"
    texts = ["1002", "1003", "1002", "1004"]
    quarters = ["2016Q1", "2016Q1", "2016Q2", "2016Q2"]
    expected = keys_by_quarter(texts, quarters, key)
    for ids in ([t + ".0" for t in texts], [float(t) for t in texts]):
        found = keys_by_quarter(ids, quarters, key)
        assert list(found) == list(expected) == ["2016Q1", "2016Q2"]
        assert all(np.array_equal(found[q], expected[q]) for q in expected)


@pytest.mark.parametrize("text, expected", [
    (pa.array(["a", "b.0"]), True), (pa.array(["a", "b"]), False), (pa.array([], type=pa.string()), False),
    (pa.array(["a", "1.0"], type=pa.string_view()), True),
    (pa.chunked_array([pa.array(["x"]), pa.array(["1."])]), True),
    (pa.array(["a", "b"], type=pa.large_string()), False),
])
def test_may_hold_point(text, expected):
    from gedp.synth.csv_values import may_hold_point

    assert may_hold_point(text) is expected


def test_the_api_notes_float_ids(small_state):
    import gedp
    from gedp.synth.intake import InputNote

    frame = small_state.head(200).assign(estab_id=np.arange(200, dtype=float))
    with pytest.warns(InputNote, match="read as its whole number"):
        release = gedp.protect(frame, "employment", seed=1, not_for_publication=True)
    assert set(release.microdata["estab_id"]) == {str(i) for i in range(200)}


SPELLINGS = {"plus": "+{}", "exponent": "{}e0", "scaled exponent": "{}0E-1", "fullwidth": "{}",
             "padded": "  {} "}
FULLWIDTH = str.maketrans("0123456789", "０１２３４５６７８９")


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_numbers_written_with_a_sign_an_exponent_or_fullwidth_digits_draw_on_the_same_accounts(
        tmp_path, records, spelling):
    """The same establishments as text ids +1000, 1000e0, 10000E-1, fullwidth digits: over the cap."""
    first = tmp_path / "plain.csv"
    records.to_csv(first, index=False)
    ledger = tmp_path / "ledger.json"
    assert protect(first, tmp_path / "r1", ledger, "--lifetime-cap", 3).exit_code == 0
    ids = [SPELLINGS[spelling].format(i) for i in records["estab_id"]]
    if spelling == "fullwidth":
        ids = [i.translate(FULLWIDTH) for i in ids]
    second = tmp_path / "spelled.parquet"
    pq.write_table(pa.Table.from_pandas(records.assign(estab_id=ids), preserve_index=False), second)
    refused = protect(second, tmp_path / "r2", ledger, "--lifetime-cap", 3)
    assert refused.exit_code == 2, refused.output
    assert "over their lifetime cap" in refused.output


#: Characters a ledger refuses in an id: by Unicode category, control (Cc: NUL, ESC, DEL, C1's NEL),
#: format (Cf), line and paragraph separators (Zl, Zp), private use (Co), unassigned (Cn), spaces other
#: than the ASCII space (Zs: no-break, ideographic), and letters that stay non-ASCII after NFKC.
HIDDEN = ["\x00", "\x1b", "\x7f", "\x85", "\u200b", "\ufeff", "\u2028", "\u2029", "\ue000", "\U000f0000",
          "\u0378", "\u00a0", "\u3000", "é"]


@pytest.mark.parametrize("hidden", HIDDEN)
def test_ids_with_invisible_or_non_ascii_characters_are_refused_by_the_ledger_without_the_value(
        tmp_path, records, hidden):
    ids = [str(i) for i in records["estab_id"]]
    ids[5] = hidden + ids[5]
    source = tmp_path / "hidden.parquet"
    pq.write_table(pa.Table.from_pandas(records.assign(estab_id=ids), preserve_index=False), source)
    refused = protect(source, tmp_path / "r", tmp_path / "ledger.json", "--lifetime-cap", 3)
    assert refused.exit_code == 2, refused.output
    assert "row 6" in refused.output and "ASCII" in refused.output
    assert str(FIRST_ID + 5) not in refused.output


def test_account_ids_follow_the_rule_of_numbers():
    from gedp.synth.schema import account_ids

    texts = ["+7", "7e0", "0.7E1", "70e-1", "-7e0", "7.5", "1E+05", "ab"]
    assert account_ids(pd.Series(texts)).to_pylist() == ["7", "7", "7", "7", "-7", "7.5", "100000", "AB"]
    with pytest.raises(InputError, match="at most 64 digits"):
        account_ids(pd.Series(["1e400"]))


#: Spellings of one id with a fraction (red team of session 22, F4: "1.50", "1.5", "1.5e0" were three
#: accounts, so the same establishments spent sqrt(3) x 2.3 = 3.99 under cap 3).
FRACTION_FORMS = ["{}.50", "{}.5", "{}.5e0", "+{}5E-1", "0{}.500"]


def test_ids_of_one_value_written_three_ways_draw_on_one_account(tmp_path, records):
    """The red team's sequence: the first release committed, the second (same establishments, ids
    spelled otherwise) over the cap; a third release of new ids (".25") still admitted (power)."""
    ledger = tmp_path / "ledger.json"
    outcomes = []
    for k, form in enumerate(["{}.50", "{}.5", "{}.5e0", "{}.25"]):
        source = tmp_path / f"ids{k}.csv"
        records.assign(estab_id=[form.format(i) for i in records["estab_id"]]).to_csv(source, index=False)
        result = protect(source, tmp_path / f"r{k}", ledger, "--lifetime-cap", 3)
        assert result.exit_code in (0, 2), result.output
        assert result.exit_code == 0 or "over their lifetime cap" in result.output, result.output
        outcomes.append(result.exit_code)
    assert outcomes == [0, 2, 2, 0]


def test_account_ids_of_numbers_are_their_values_in_plain_decimal():
    """Random numbers written in random ways: two ids are one account iff they have one value
    (compared with Python's Fraction, exact), and the account is the value's plain decimal text."""
    from fractions import Fraction

    from gedp.synth.schema import account_ids

    rng = np.random.default_rng(22)
    values = [Fraction(int(rng.integers(-10**6, 10**6)), 10 ** int(rng.integers(0, 5))) for _ in range(400)]

    def plain(digits: int, point: int) -> str:
        """digits / 10^point in plain decimal, written with ``point`` digits after the point."""
        if point <= 0:
            return str(digits) + "0" * -point
        text = str(digits).rjust(point + 1, "0")
        return text[:-point] + "." + text[-point:]

    def spelled(value: Fraction) -> str:
        """value with extra zeros after its point, an exponent, a sign and leading zeros, at random."""
        scale = 4 + int(rng.integers(0, 4))  # value = digits / 10^scale exactly (it has at most 4 decimals)
        digits = abs(value.numerator) * 10**scale // value.denominator
        shift = int(rng.integers(-3, 4)) if rng.random() < 0.5 else 0
        text = plain(digits, scale + shift) + (f"{'eE'[int(rng.integers(2))]}{shift:+d}" if shift else "")
        sign = "-" if value < 0 else ("+" if rng.random() < 0.3 else "")
        return sign + "0" * int(rng.integers(0, 3)) + text

    texts = [spelled(v) for v in values]
    assert [Fraction(t) for t in texts] == values and any("e" in t.lower() for t in texts)  # exact spellings
    accounts = account_ids(pd.Series(texts)).to_pylist()
    for value, account in zip(values, accounts):
        assert Fraction(account or "0") == value  # its value
        assert not account.startswith(("+", "0")) and "E" not in account and not account.endswith(".")
        assert "." not in account or not account.endswith("0")  # plain: no trailing zero after a point
    assert len(set(accounts)) == len(set(values))  # one account per value, never two
    with pytest.raises(InputError, match="at most 64 digits before and 64 after its point") as refused:
        account_ids(pd.Series(["12", "1e400"]))
    assert "row 2" in str(refused.value) and "ASCII" not in str(refused.value) and "400" not in str(refused.value)
    for tiny in ("1e-400", "0." + "0" * 70 + "1"):
        with pytest.raises(InputError, match="at most 64 digits"):
            account_ids(pd.Series([tiny]))


# --- one account, one record (red team, session 21) ---------------------------------------------------

COLLISIONS = {"leading zero": "0{}", "padded": " {} ", "lower case": "{}"}


def gedp_protect(*arguments, cwd, child: bool) -> tuple[int, str, str]:
    """``gedp protect`` run in ``cwd``: in a child process, as a user runs it (``child``), or through the
    command line's runner in this process (the same command and refusal, without an interpreter to
    start); (exit status, standard output, standard error)."""
    import os
    import subprocess
    import sys

    if child:
        done = subprocess.run([sys.executable, "-m", "gedp", "protect", *map(str, arguments)], cwd=cwd,
                              capture_output=True, text=True, timeout=300)
        return done.returncode, done.stdout, done.stderr
    before = os.getcwd()
    os.chdir(cwd)
    try:
        result = runner.invoke(app, ["protect", *map(str, arguments)])
    finally:
        os.chdir(before)
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("ledger", [True, False])
@pytest.mark.parametrize("spelling", COLLISIONS)
def test_two_records_of_one_account_are_refused_naming_rows_not_ids(tmp_path, records, spelling, ledger):
    """Row 8 spells row 3's id as its account does (a leading zero, blanks, lower case): a release would
    measure the establishment twice while the ledger charges its account once (two records at 2.3
    each cost sqrt(2) x 2.3 = 3.3 > cap 3). Refused on intake, with or without a ledger, in one line
    naming the two rows and neither id; nothing is written. One case runs ``gedp protect`` as a child
    process (its exit status and standard error as a user gets them), the others in this process."""
    ids = [f"A{i}" for i in records["estab_id"]]
    ids[7] = COLLISIONS[spelling].format(ids[2])
    if spelling == "lower case":
        ids[7] = ids[7].lower()
    source = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pandas(records.assign(estab_id=ids), preserve_index=False), source)
    extra = ["--ledger", "books/ledger.json", "--lifetime-cap", 3] if ledger else ["--not-for-publication", "--seed", 1]
    (tmp_path / "books").mkdir()
    status, stdout, stderr = gedp_protect(source, "--config", "employment", "--out", "r", *extra, cwd=tmp_path,
                                          child=(spelling, ledger) == ("leading zero", True))
    assert status == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "row 8 is the establishment of row 3" in lines[0], stderr
    assert str(FIRST_ID + 2) not in stderr + stdout
    assert not (tmp_path / "r").exists() and list((tmp_path / "books").iterdir()) == []


def test_the_unique_check_refuses_exactly_the_ids_the_ledger_merges(small_state):
    """Random spellings of a few ids: validation refuses an input iff the ledger's keys of its ids
    (a keyed hash of each account) are fewer than its rows, and accepts it otherwise."""
    rng = np.random.default_rng(21)
    frame = small_state.head(6).copy()
    forms = [lambda t: t, lambda t: "0" + t, lambda t: t.lower(), lambda t: f" {t} ", lambda t: "00" + t.lower(),
             lambda t: t + ".0"]
    stems = ["A7", "7", "B07", "12", "C1", "70", "X", "0", "1E1", "10"]
    outcomes = set()
    for _ in range(200):
        ids = [forms[rng.integers(len(forms))](stems[rng.integers(len(stems))]) for _ in range(len(frame))]
        merged = len(establishment_keys(ids, "0123456789abcdef")) < len(ids)
        try:
            validate_microdata(frame.assign(estab_id=ids))
            refused = False
        except InputError as error:
            assert "ids must be unique" in str(error)
            refused = True
        assert refused == merged, ids
        outcomes.add(refused)
    assert outcomes == {True, False}




def test_a_control_character_gives_no_fresh_budget(tmp_path, records):
    """The red team's input: the first release's ids each with a DEL appended. Refused by the ledger
    (it was admitted as 400 new establishments), so the accounts stay at one release's charge."""
    ledger = tmp_path / "ledger.json"
    first = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pandas(records.assign(estab_id=records["estab_id"].astype(str)),
                                        preserve_index=False), first)
    assert protect(first, tmp_path / "ra", ledger, "--lifetime-cap", 3).exit_code == 0
    second = tmp_path / "b.parquet"
    pq.write_table(pa.Table.from_pandas(records.assign(estab_id=records["estab_id"].astype(str) + "\x7f"),
                                        preserve_index=False), second)
    refused = protect(second, tmp_path / "rb", ledger)
    assert refused.exit_code == 2, refused.output
    assert "row 1" in refused.output and "control" in refused.output and str(FIRST_ID) not in refused.output
    assert not (tmp_path / "rb").exists()


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_account_ids_refuse_hidden_characters_anywhere(hidden, where):
    ids = {"start": hidden + "1002", "middle": "10" + hidden + "02", "end": "1002" + hidden}[where]
    with pytest.raises(InputError, match="ids must be ASCII text.*first at row 2$"):
        from gedp.synth.schema import account_ids

        account_ids(pd.Series(["7", ids, "8"]))
