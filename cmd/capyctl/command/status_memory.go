// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"encoding/json"
	"fmt"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// printMemory renders a deployment's memory (its charge per phase, on the
// card and in host RAM, with where each figure came from) and the host's
// ledger (every domain's capacity, limit, reserve, charges and what is
// free), for `capyctl status deployment`.
func (c *Meta) printMemory(st *wire.DeploymentStatus) {
	if len(st.Memory) == 0 {
		return
	}
	var mv wire.MemoryView
	data, err := json.Marshal(st.Memory)
	if err == nil {
		err = json.Unmarshal(data, &mv)
	}
	if err != nil {
		fmt.Fprintf(c.Out, "\nmemory: %v\n", st.Memory)
		return
	}
	b := structs.FormatBytes
	fmt.Fprintln(c.Out)
	where := ""
	if mv.Domain != "" {
		where = ", placed on " + mv.Domain
	}
	fmt.Fprintf(c.Out, "Memory (host %s%s):\n", mv.Host, where)
	startupProv := mv.Startup.DeviceProvenance
	if mv.Startup.HostProvenance != mv.Startup.DeviceProvenance {
		startupProv = "card " + mv.Startup.DeviceProvenance + ", host " + mv.Startup.HostProvenance
	}
	c.Table([]string{"PHASE", "CARD", "HOST RAM", "PROVENANCE"}, [][]string{
		{"startup", b(mv.Startup.DeviceBytes), b(mv.Startup.HostBytes), orDash(startupProv)},
		{"ready", b(mv.Ready.DeviceBytes), b(mv.Ready.HostBytes), orDash(mv.Ready.Provenance)},
		{"parked", b(mv.Parked.DeviceBytes), b(mv.Parked.HostBytes), orDash(mv.Parked.Provenance)},
	})
	if mv.Startup.ObservedSamples > 0 {
		fmt.Fprintf(c.Out, "starting: %s on the card and %s of host RAM measured so far (%d samples)\n",
			b(mv.Startup.ObservedDeviceBytes), b(mv.Startup.ObservedHostBytes), mv.Startup.ObservedSamples)
	}
	if m := mv.Measured; m != nil {
		fmt.Fprintf(c.Out, "measured startup peak: %s on the card, %s of host RAM (%d samples, %s)\n",
			b(m.DeviceBytes), b(m.HostBytes), m.Samples, m.At.Format("2006-01-02 15:04:05Z07:00"))
	}
	if len(mv.Ledger) == 0 {
		return
	}
	fmt.Fprintf(c.Out, "\nHost ledger (%s):\n", mv.Host)
	rows := make([][]string, 0, len(mv.Ledger))
	for _, d := range mv.Ledger {
		name := d.Name
		if d.DeviceUUID != "" {
			name += " " + d.DeviceUUID
		}
		ext := "-"
		if d.External > 0 {
			ext = b(d.External)
		}
		rows = append(rows, []string{name, d.Kind, b(d.Capacity), b(d.ManagedLimit), b(d.FreeReserve), ext, b(d.Charged), b(d.Free)})
	}
	c.Table([]string{"DOMAIN", "KIND", "CAPACITY", "LIMIT", "RESERVE", "OUTSIDE", "CHARGED", "FREE"}, rows)
}
