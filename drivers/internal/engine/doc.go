// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package engine is what only the first-party drivers share and no
// third-party driver needs: the release comparisons of their version gates
// and the clean-up of the shared-memory segments SGLang leaves behind.
// Everything else a driver needs (the per-instance handle, the registry,
// readiness, the endpoint, the environment, refusals, the idle signal) is
// the public engine kit, sdk/enginekit, which these drivers import exactly
// as a third-party driver does.
package engine
