"""loglake.wire — byte formats shared by the parts: BARE, Ockam routing/TCP, ICRC-16, protobuf."""
