"""Fault injection against a fleet: scenarios (``scenarios``), what they attack and how
(``target``), the records they attack it with (``records``), and a local fleet to run
them on (``local``). ``scripts/chaos.py`` runs them from the command line."""
