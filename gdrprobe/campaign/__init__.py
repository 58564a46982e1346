"""What is built on single runs: the host/GPU A/B and its verdict, the prelaunch gate, the
benchmark sweep and the node x node cluster matrix. Above measure/ (the run engine) and
the doctor; below the public API."""
