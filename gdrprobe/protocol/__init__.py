"""The out-of-band channel between client and server: framing, deadlines and sealed frames
(``channel``), the token policy (``token``), the handshake that proves the token
(``handshake``), the server's door for connections that have not proved it yet (``door``,
``admission``), the server's log (``serverlog``), checked peer fields (``fields``) and the
run's messages (``messages``)."""
