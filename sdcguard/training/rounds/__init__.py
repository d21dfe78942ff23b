"""The sampled rounds: who replays whom (:mod:`.pairing`, :mod:`.roles`), the peer round (:mod:`.peer`) and the
dedicated shadows (:mod:`.shadows`, with their messages in :mod:`.wire`), all behind one :class:`~.round.Round`
protocol."""
