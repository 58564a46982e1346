"""What NCCL will do: its environment variables read as NCCL reads them (``env``) and
what an NCCL_DEBUG=INFO log proves (``log``). Pure Python."""
