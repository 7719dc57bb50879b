"""What a worker pod's two programs exchange through files and sockets: each rank's
heartbeat page (``heartbeat.py``), its exit record (``exitrecord.py``), a user script's
progress (``progress.py``), and the rank's side of the fork server (``standin.py``).
Written by one side and read by the other, so it depends on neither."""
