"""Malformed watch logs for the tests: a valid log, and seeded mutations of it.

Each mutation is one change, at the SQL level (a table dropped or renamed, a column's values
replaced by text, blobs, huge or negative numbers, NULLs; a histogram blob cut or grown; a
``meta`` value deeply nested, huge or of another type; rows duplicated) or at the byte level
(bytes of a page flipped, the file cut short, the header overwritten). ``name`` says what
was done, so that a failing case can be rebuilt from its seed.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TABLES = ("meta", "steps", "stats", "reports")
COLUMNS = {
    "steps": ("step", "rank", "loss", "wall_time", "seconds"),
    "stats": ("step", "layer", "call", "kind", "rank", "numel", "count", "nan_count", "inf_count", "zero_count",
              "min", "max", "mean", "std", "sum", "sum_abs", "m2", "l2", "mean_abs", "update_ratio", "hist_lo",
              "hist"),
    "reports": ("step", "layer", "message"),
    "meta": ("key", "value"),
}
ODD_VALUES = ("'text'", "X'00ff'", "NULL", "9223372036854775807", "-9223372036854775808", "1e308", "-1e308",
              "-1", "0", "''", "'1e999'", "4.5", "'grad_output'")


def valid_log(path: Path, steps: int = 4) -> Path:
    """A small watch log of a 3-layer MLP, with a NaN at step 2 and a report."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from gradexplorer.recording.watch import watch

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, out=str(path), every=1) as w:
        for i in range(steps):
            x = torch.randn(4, 6)
            if i == 2:
                x[0, 0] = float("nan")
            loss = F.cross_entropy(model(x), torch.tensor([0, 1, 2, 0]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            w.step(loss=loss)
    return path


@dataclass(frozen=True)
class Mutation:
    """One change to a valid log: ``apply(path)`` makes it on a copy."""

    name: str
    apply: Callable[[Path], None]


def _sql(*statements: str) -> Callable[[Path], None]:
    def run(path: Path) -> None:
        con = sqlite3.connect(path)
        try:
            for sql in statements:
                con.execute(sql)
            con.commit()
        finally:
            con.close()
    return run


def _bytes(change: Callable[[bytearray, random.Random], None], seed: int) -> Callable[[Path], None]:
    def run(path: Path) -> None:
        data = bytearray(path.read_bytes())
        change(data, random.Random(seed))
        path.write_bytes(bytes(data))
    return run


def _flip(data: bytearray, rng: random.Random) -> None:
    for _ in range(rng.randint(1, 64)):
        data[rng.randrange(len(data))] = rng.randrange(256)


def _cut(data: bytearray, rng: random.Random) -> None:
    del data[rng.randrange(16, len(data)):]


def _scribble_page(data: bytearray, rng: random.Random) -> None:
    page = rng.randrange(1, max(2, len(data) // 4096))
    start = page * 4096 + rng.randrange(0, 200)
    data[start: start + 256] = bytes(rng.randrange(256) for _ in range(256))[: max(0, len(data) - start)]


def _one(rng: random.Random, seed: int) -> Mutation:
    kind = rng.choice(("value", "value", "value", "drop", "rename", "hist", "meta", "rows", "bytes"))
    if kind == "value":
        table = rng.choice(("steps", "stats", "stats", "reports"))
        column = rng.choice(COLUMNS[table])
        value = rng.choice(ODD_VALUES)
        where = rng.choice(("", f" WHERE rowid = {rng.randint(1, 12)}", f" WHERE rowid % {rng.randint(2, 5)} = 0"))
        return Mutation(f"{table}.{column} = {value}{where}",
                        _sql(f"UPDATE OR IGNORE {table} SET \"{column}\" = {value}{where}"))
    if kind == "drop":
        table = rng.choice(TABLES)
        return Mutation(f"drop {table}", _sql(f"DROP TABLE {table}"))
    if kind == "rename":
        table = rng.choice(TABLES)
        column = rng.choice(COLUMNS[table])
        return Mutation(f"rename {table}.{column}",
                        _sql(f"ALTER TABLE {table} RENAME COLUMN \"{column}\" TO x_{column}"))
    if kind == "hist":
        blob = rng.choice(("X'01'", "X'0102030405'", "zeroblob(8 * 5000)", "zeroblob(7)", "randomblob(64)",
                           "X'ffffffffffffff7f'"))
        lo = rng.choice(("hist_lo", "-5", "1000000", "NULL", "2000"))
        return Mutation(f"stats.hist = {blob}, hist_lo = {lo}", _sql(
            f"UPDATE stats SET hist = {blob}, hist_lo = {lo} WHERE rowid % {rng.randint(1, 4)} = 0"))
    if kind == "meta":
        key = rng.choice(("layers", "every", "world_size", "format", "version", "params", "model"))
        depth = rng.choice((50, 1000, 100_000))
        value = rng.choice((f"'{'[' * depth}{']' * depth}'", "X'00'", "NULL", "123", "'{\"a\": '",
                            "'[1, 2, 3]'", "'gradexplorer-watch'", "'999'"))
        return Mutation(f"meta.{key} = {value[:20]}", _sql(f"INSERT OR REPLACE INTO meta VALUES ('{key}', {value})"))
    if kind == "rows":
        choice = rng.choice(("INSERT INTO stats SELECT * FROM stats",
                             "DELETE FROM stats WHERE rowid % 2 = 0",
                             "DELETE FROM steps",
                             "INSERT INTO reports VALUES (NULL, NULL, NULL)",
                             "UPDATE stats SET layer = '' WHERE rowid = 1",
                             "UPDATE stats SET layer = 'a.' || hex(zeroblob(1500)) || 'b' WHERE rowid = 1",
                             "UPDATE stats SET kind = 'activation' WHERE kind = 'grad_output'"))
        return Mutation(f"rows: {choice[:50]}", _sql(choice))
    change = rng.choice((_flip, _cut, _scribble_page))
    return Mutation(f"bytes: {change.__name__} seed {seed}", _bytes(change, seed))


def mutations(seed: int = 0, count: int = 300) -> list[Mutation]:
    """``count`` seeded mutations."""
    rng = random.Random(seed)
    return [_one(rng, seed * 1_000_003 + i) for i in range(count)]


def mutated(base: Path, mutation: Mutation, out: Path) -> Path:
    """A copy of ``base`` with ``mutation`` made (a mutation SQLite refuses leaves the copy as is)."""
    shutil.copyfile(base, out)
    with contextlib.suppress(sqlite3.Error):
        mutation.apply(out)
    return out
