"""Audits of what gedp writes: the bytes of a release (``release``) and the privacy of the release
path measured from its outputs (``pipeline``), with the statistics they share (``bounds``)."""
