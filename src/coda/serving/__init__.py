"""HTTP serving shared by the gateway and the fake engine: listening sockets, errors in the caller's
API format, and starting Coda's servers as child processes."""
