"""Every family's run-time lookup: the key of its entries and the entry served for a problem.

One module per family -- ``decode``, ``backward``, ``varlen``, ``varlen_bwd`` (the dense forward's lookup is
:func:`rocmflash.db.lookup`) -- each importing only :mod:`rocmflash.db` and :mod:`rocmflash.config`, so the
run time (``rocmflash.api``) reads the tuner's entries without importing the tuner. The tuner
(:mod:`rocmflash.tuning`) writes entries under these keys and imports them from here.
"""
