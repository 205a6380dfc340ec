package kubevirt

// PowerWishes is how many runStrategy writes have been asked for, so tests
// can order concurrent callers.
func (b *Backend) PowerWishes() uint64 {
	b.power.mu.Lock()
	defer b.power.mu.Unlock()
	return b.power.asked
}
