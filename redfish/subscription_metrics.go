package redfish

// EventSubscriptions is how many push subscriptions the service holds,
// those delivering and those suspended (by SuspendRetries giving up on
// their destination, or by a client); SSE streams, also members of the
// collection, are EventStreams'. It is cheap enough to read at every
// metrics scrape: the table holds at most MaxEventSubscriptions pushes
// and MaxEventStreams streams.
func (s *Server) EventSubscriptions() (enabled, suspended int) {
	s.subscriptions.mu.Lock()
	defer s.subscriptions.mu.Unlock()
	for _, sub := range s.subscriptions.byID {
		switch {
		case sub.kind != subscriptionRedfishEvent:
		case sub.suspended:
			suspended++
		default:
			enabled++
		}
	}
	return enabled, suspended
}
