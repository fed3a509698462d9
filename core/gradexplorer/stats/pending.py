"""Statistics already computed, written into their records when the records are first read.

The batch kernel (``gradexplorer.stats.cpu``) leaves a capture's statistics in two small
tables: one row of numbers and one histogram row per tensor. Turning a row into its
``TensorStats`` record (fourteen keys, their Python floats, a view of the histogram table)
costs more than computing it: on a 200-layer MLP of 256-value tensors, about a third of a
statistics-only capture's cost per module call above a bare hook pair
(``python -m benchmarks.call_breakdown``, docs/benchmarks.md). A capture therefore keeps the
tables and the empty records handed out, and fills them all together the first time any of
its records is read (``gradexplorer.capturing.data.Capture.layers``). The numbers are the
same: the same rows, through the same function (``cpu.records_from_rows``), only later.

The tables hold one row per tensor, not the tensors: what waits here is a few hundred bytes
per record (and the histograms the records would hold anyway).
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class PendingRecords:
    """Records whose statistics are computed and not yet written into them.

    ``add`` takes a function that fills a batch of records (``cpu.records_from_rows`` with
    its arguments bound) and whether any of the batch's tensors held NaN or Inf; ``fill``
    runs every function added so far, once. Safe to call from several threads: a second
    caller waits until the first has filled every record.
    """

    def __init__(self) -> None:
        self._fills: list[Callable[[], object]] = []
        # Whether any record waiting here counts a NaN or an Inf: the capture's onset reads
        # the counts of all of them only then (and reads an empty record as finite).
        self.nonfinite = False
        self._lock = threading.Lock()

    def add(self, fill: Callable[[], object], nonfinite: bool) -> None:
        """Keep ``fill`` (it writes a batch of records) for :meth:`fill`."""
        self._fills.append(fill)
        if nonfinite:
            self.nonfinite = True

    def fill(self) -> None:
        """Write every record waiting here; nothing waits afterwards."""
        with self._lock:
            fills = self._fills
            while fills:  # (one at a time: a batch that raised leaves the others waiting)
                fills.pop(0)()

    def __len__(self) -> int:
        """Batches of records still waiting."""
        return len(self._fills)
