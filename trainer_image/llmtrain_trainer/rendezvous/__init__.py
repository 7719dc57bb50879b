"""The rendezvous store pod: torch's c10d TCPStore apart from every worker
(``store.py``), and the launchers' rendezvous leases beside it (``leases.py``, whose
client the launcher side holds)."""
