package conformance

// Lookup lets the external tests walk a decoded body as the suite does.
var Lookup = lookup
