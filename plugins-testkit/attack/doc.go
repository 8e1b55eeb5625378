// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package attack plays the adversaries of CapyCTL's trust model in tests:
//
//   - a network flooder (Flood with many source addresses): TCP
//     connections that send nothing, or a few bytes, and stay open;
//   - a local-user flooder (Flood on loopback): the same against a
//     role's loopback listeners, as any user of the machine can;
//   - a compromised host (CompromisedHost): a real joined host's key and
//     certificate, taken from its state directory, driving the host link
//     (any message, forged or oversized, in any order) and the relay (any
//     answer to what the server sends).
//
// The trust model these attacks test is in the several-machines guide
// (website/content/operations/several-machines.md, "Trust model"); the
// attack rows of `make faults` (plugins-testkit/faults) use this package.
// It speaks the wire as a stranger would: it imports the host link's
// protocol and nothing of the fleet's code.
package attack
