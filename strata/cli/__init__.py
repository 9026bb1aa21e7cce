"""The ``strata`` command line. Each command group lives in its own module with a ``register``
function; ``main`` only assembles them."""
