"""Measuring and fitting cost profiles offline: GPU kernels (``measure``), a live engine through its
API (``api_measure``, ``empirical_fit``), attention constants from measured CSVs (``measured``, ``fit``,
checked by ``check``) and the hardware and model shapes they assume (``catalog``). The simulator and the
shells never import this package; they read the profiles it writes (``coda.cost``)."""
