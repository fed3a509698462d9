"""The gradexplorer program: the window and the command line over ``core``.

Importing this package sets one process-wide torch setting, before torch is imported (the
``gradexplorer`` command and ``python -m app`` import it first):

* ``THP_MEM_ALLOC_ENABLE=1`` on Linux: torch's CPU allocator asks the kernel for 2 MiB
  pages for each allocation of 2 MiB or more. A capture writes hundreds of new tensors (its
  copies, and the gradients autograd hands over instead of reusing their memory), and on
  4 KiB pages each page costs a fault when first written: a full capture of resnet50 at
  batch 8 took 355,000 faults and 2.4 s of system time on the two-core build machine
  (0.9 s of wall time more than with 2 MiB pages). torch reads the variable once, at its
  first allocation. A value the user set is kept; ``THP_MEM_ALLOC_ENABLE=0`` turns it off.
"""

import os
import sys

if sys.platform.startswith("linux"):
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
