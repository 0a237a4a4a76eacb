// Package provider fetches grid carbon intensity over the network, for package carbon's
// Tracker: ElectricityMaps (gCO2eq/kWh) and WattTime (its co2_moer signal index, a 0–100
// percentile of the region's recent marginal emissions, so a tracker's threshold with it is a
// percentile). New maps a Config, the node's carbon flags, to any carbon.Provider, carbon.Static
// included; TokenFromEnvOrFile reads a provider's secret from the environment or a file,
// never from a flag.
//
// It is the one edge of the carbon signal: the standard library with net/http, and carbon,
// no os/exec, no cgo. It starts no goroutines; the node polls. Providers report failures with
// carbon's typed errors (*carbon.RateLimitedError, *carbon.HTTPError, carbon.ErrMalformed),
// wrap carbon.ErrConfig for bad settings, and honour ctx's deadline; a nil HTTPClient means a
// shared client with a 30-second timeout as a backstop.
//
// # Usage
//
//	p, err := provider.New(provider.Config{Kind: provider.KindElectricityMaps, Zone: "DE", Token: tok})
//	if err != nil { ... }
//	r, err := p.Fetch(ctx, time.Now())
//
// # Concurrency and zero values
//
// New does no I/O. WattTime is safe for concurrent use (it serialises fetches to keep its
// login token); ElectricityMaps is read-only after construction. Their zero values are not
// usable: Fetch returns an error wrapping carbon.ErrConfig until the zone or region and the
// credentials are set. The zero Config is refused by New (no kind).
package provider
