"""The ``strata`` command line. Each command group lives in its own module with a ``register``
function; ``main`` only assembles them."""

import os
import sys

# A progress bar redraws in place on a terminal; written to a file or a pipe, every redraw is a line
# (a `make demo > log` held thousands). There it draws at most every 30 s. Set before tqdm is first
# imported (it reads TQDM_* then); services that `strata up` and `strata demo` start inherit it.
if not sys.stderr.isatty():
    os.environ.setdefault("TQDM_MININTERVAL", "30")
