"""The default van: ZeroMQ with every peer, byteps_tcp between our nodes, chosen per peer."""
