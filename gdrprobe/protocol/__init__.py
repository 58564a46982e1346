"""The out-of-band channel between client and server: framing, deadlines and
authentication (``channel``), checked peer fields (``fields``) and the handshake's
messages (``messages``)."""
