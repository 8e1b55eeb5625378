// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/config"
	"github.com/capyctl/capyctl/core/fleet"
	"github.com/capyctl/capyctl/core/fleet/hostagent"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/lifecycle"
	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/runinfo"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/core/version"
)

// openServer prepares the server role: no GPU, drivers or engines; the
// cluster listener, the CA and the state machine, and the two HTTP
// listeners.
func (a *Agent) openServer() error {
	listen := a.s.ClusterListen
	if listen == "" {
		listen = "0.0.0.0:8444"
	}
	// The Responses API's stored responses of the requests this server
	// takes: its IDs name this server (core/fleet/responses.go).
	a.Responses = a.openResponses()
	// The keys are the cluster's (replicated; the keeper opens on the
	// server's state below); the usage is this server's own.
	if err := a.openUsage(); err != nil {
		_ = a.Responses.Close()
		a.Store.Close()
		return err
	}
	var collectors []prometheus.Collector
	if a.Usage != nil {
		collectors = append(collectors, a.Usage)
	}
	srv, err := fleet.NewServer(fleet.ServerOptions{Collectors: collectors, StateDir: a.s.StateDir, Listen: listen, Advertise: a.s.ClusterAdvertise,
		Store: a.Store, Logger: a.logger, Heartbeat: a.s.HostHeartbeat,
		GroupStallTimeout: a.s.GroupStallTimeout, RescheduleAfter: a.s.RescheduleAfter, RefuseAdoption: a.s.RefuseAdoption,
		Name: a.s.Hostname, BootstrapExpect: a.s.BootstrapExpect, Join: a.s.ServerJoin, JoinToken: a.s.JoinToken,
		Responses: a.Responses,
		// One API key and one admin token per cluster: a joining server
		// takes the cluster's in place of those its first start made.
		Secrets: func() fleet.ClusterSecrets {
			return fleet.ClusterSecrets{APIKey: a.Creds.APIKey, AdminToken: a.Creds.AdminToken}
		},
		AdoptSecrets: func(cs fleet.ClusterSecrets) error {
			c := &runinfo.Credentials{APIKey: cs.APIKey, AdminToken: cs.AdminToken}
			if err := runinfo.WriteCredentials(a.s.StateDir, c); err != nil {
				return structs.Wrap(structs.CodeInternal, err, "write the cluster's credentials")
			}
			a.Creds = c
			return nil
		}})
	if err != nil {
		a.closeKeys()
		_ = a.Responses.Close()
		a.Store.Close()
		return err
	}
	a.Fleet = srv
	if err := a.openKeeper(srv.KeyBackend()); err != nil {
		srv.Close()
		_ = a.Responses.Close()
		a.Store.Close()
		return err
	}
	if err := a.listen(); err != nil {
		srv.Close()
		a.closeKeys()
		_ = a.Responses.Close()
		a.Store.Close()
		return err
	}
	return nil
}

// startServer serves the server role: the cluster listener, the relayed
// inference API and the management API answered from the hosts.
func (a *Agent) startServer() error {
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	a.Fleet.Start()
	// The server's own reasons to stop (a command of the replicated log it
	// cannot apply, its removal from the cluster) stop the role.
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		select {
		case err := <-a.Fleet.Fatal():
			select {
			case a.fatal <- err:
			default:
			}
		case <-ctx.Done():
		}
	}()
	if err := a.Fleet.JoinCluster(ctx); err != nil {
		return err
	}
	a.Fleet.UseKeys(a.Keys)
	role := func() wire.RoleInfo {
		return wire.RoleInfo{Role: a.s.Role, Version: version.Version, Commit: version.GetCommit(), Host: a.s.Hostname,
			Inference: a.InferenceAddr(), StartedAt: a.startedAt, PID: os.Getpid(),
			TLS: a.s.TLS.Enabled(), ClientCertificates: a.s.TLS.ClientCAFile != "", Warnings: a.Warnings()}
	}
	backend := &api.Backend{
		Store: a.Store, Logger: a.logger, Role: role(), Hosts: a.Fleet.Hosts, Fleet: a.Fleet, Keys: a.Keys, Usage: a.Usage,
		PeerUsage: a.Fleet.PeerUsage, PeerKeyUses: a.Fleet.PeerKeyUses,
		Override: a.Fleet.ManagementOverrides(role),
		Servers:  a.Fleet, Forward: a.Fleet.ForwardMutation,
	}
	if rc := a.s.Config; rc != nil {
		backend.Config = func() *wire.RoleConfig { return rc }
	}
	iopts, mopts := a.s.Listener.options("inference", a.logger), a.s.Listener.options("management", a.logger)
	inference := a.Fleet.InferenceHandler(a.Keys, api.AuthOptions{FailuresPerMinute: a.s.Listener.AuthFailuresPerMinute}, a.s.MaxBodyBytes, a.s.MaxBodyBytesInFlight)
	backend.Inference, backend.InferenceKeys = inference, a.playgroundKeys
	a.inferenceSrv = api.NewServer(api.BodyDeadline(inference, iopts.BodyReadTimeout), iopts)
	mgmt := api.NewManagementHandler(backend, a.Creds.AdminToken)
	a.Fleet.ServeManagement(mgmt, a.Creds.AdminToken)
	a.mgmtSrv = api.NewServer(api.BodyDeadline(mgmt, mopts.BodyReadTimeout), mopts)
	a.serve()
	return a.writeRunInfo()
}

// serve runs the inference and management servers on their listeners.
func (a *Agent) serve() {
	servers := []struct {
		srv *http.Server
		ln  net.Listener
	}{{a.inferenceSrv, a.inferenceLim}, {a.mgmtSrv, a.mgmtLim}}
	if a.inferenceTLS != nil {
		servers[0].ln = a.inferenceTLS
	}
	if a.mgmtSock != nil {
		servers = append(servers, struct {
			srv *http.Server
			ln  net.Listener
		}{a.mgmtSrv, a.mgmtSock})
	}
	for _, p := range servers {
		a.wg.Add(1)
		go func(srv *http.Server, ln net.Listener) {
			defer a.wg.Done()
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.logger.Error("listener stopped", "address", ln.Addr().String(), "error", err)
			}
		}(p.srv, p.ln)
	}
}

// joinServer joins the server (with the join token when this host holds
// no certificate yet) and keeps the host link and relay up until the role
// stops. The server's lasting refusal (host_name_changed, host_revoked)
// stops the role.
func (a *Agent) joinServer(ctx, rctx context.Context) error {
	h, err := hostagent.NewHost(ctx, hostagent.HostOptions{StateDir: a.s.StateDir, Server: a.s.ServerAddress, JoinToken: a.s.JoinToken,
		Name: a.s.Hostname, Local: a, Logger: a.logger})
	if err != nil {
		return err
	}
	a.FleetHost = h
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := h.Run(rctx); err != nil {
			a.logger.Error("the server refuses this host", "error", err)
			select {
			case a.fatal <- err:
			default:
			}
		}
	}()
	return nil
}

// Fatal carries an error that must stop the role (a host its server
// refuses for good).
func (a *Agent) Fatal() <-chan error { return a.fatal }

// relayHandler serves the relay on a host: /v1/* goes to the host's
// inference API and the rest to its management API, each with the host's
// own credential, since the relay's mutual TLS authenticated the server.
func relayHandler(inference, management http.Handler, creds *runinfo.Credentials) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			r.Header.Set("Authorization", "Bearer "+creds.APIKey)
			// The server's own members (a Responses request's history and
			// ID) and the key it relays for are honoured on this path only.
			ctx := router.WithRelayed(r.Context())
			if name := r.Header.Get(router.HeaderKeyName); name != "" {
				weight, _ := strconv.Atoi(r.Header.Get(router.HeaderKeyWeight))
				ctx = router.WithRelayedKey(ctx, name, weight)
			}
			inference.ServeHTTP(w, r.WithContext(ctx))
			return
		}
		r.Header.Set("Authorization", "Bearer "+creds.AdminToken)
		management.ServeHTTP(w, r)
	})
}

// RelayHandler implements hostagent.Local.
func (a *Agent) RelayHandler() http.Handler { return a.relay }

// Inventory implements hostagent.Local: the cards, the host's RAM, the
// registered engines.
func (a *Agent) Inventory() *hostv1.Inventory {
	inv := &hostv1.Inventory{Unified: a.Placer != nil && a.Placer.Unified()}
	if a.Placer != nil {
		h := a.Placer.Host()
		for _, d := range h.GPUs {
			inv.Cards = append(inv.Cards, &hostv1.Card{Uuid: d.UUID, Index: uint32(d.Index), Name: d.Name, MemoryBytes: d.TotalBytes})
		}
		for _, dom := range h.Ledger.Domains {
			if dom.Name == "system" {
				inv.HostMemoryBytes = dom.Capacity
			}
		}
	}
	if list, err := a.Engines.List(); err == nil {
		for _, e := range list {
			inv.Engines = append(inv.Engines, &hostv1.Engine{Name: e.Name, Family: e.Family, Version: e.Version, Digest: e.Digest})
		}
	}
	return inv
}

// Readings implements hostagent.Local: each ledger domain as it stands.
func (a *Agent) Readings() []*hostv1.LedgerReading {
	if a.Placer == nil {
		return nil
	}
	h := a.Placer.Host()
	used := map[string]int64{}
	for _, d := range h.GPUs {
		used[d.UUID] = d.UsedBytes
	}
	out := make([]*hostv1.LedgerReading, 0, len(h.Ledger.Domains))
	for _, d := range h.Ledger.Domains {
		out = append(out, &hostv1.LedgerReading{Domain: d.Name, DeviceUuid: d.DeviceUUID, CapacityBytes: d.Capacity,
			UsedBytes: used[d.DeviceUUID], ExternalBytes: d.External, ChargedBytes: d.Charged, RoomBytes: d.Room})
	}
	return out
}

// Events implements hostagent.Local: the host's event journal after cursor,
// each with its deployment and payload as attributes.
func (a *Agent) Events(cursor uint64, max int) ([]*hostv1.Event, uint64) {
	if max <= 0 {
		seq, _ := a.Store.LatestEventSeq()
		return nil, seq
	}
	evs, err := a.Store.EventsAfter(cursor, max)
	if err != nil {
		return nil, cursor
	}
	out := make([]*hostv1.Event, 0, len(evs))
	for _, e := range evs {
		attrs := map[string]string{}
		if e.Deployment != "" {
			attrs["deployment"] = e.Deployment
		}
		for k, v := range e.Payload {
			attrs[k] = fmt.Sprint(v)
		}
		msg, _ := e.Payload["message"].(string)
		out = append(out, &hostv1.Event{TimeUnixMs: e.At.UnixMilli(), Kind: e.Kind, InstanceId: e.Instance, Message: msg, Attributes: attrs})
		cursor = e.Seq
	}
	return out, cursor
}

// Journals implements hostagent.Local: every instance the host holds.
func (a *Agent) Journals() []*hostv1.InstanceJournal {
	var out []*hostv1.InstanceJournal
	for _, v := range a.Lifecycle.Deployments() {
		for _, in := range v.Instances {
			j := &hostv1.InstanceJournal{InstanceId: structs.InstanceID(in.Deployment, in.Index), Generation: in.Generation,
				Deployment: in.Deployment, State: string(in.State), SinceUnixMs: in.Since.UnixMilli(), Residency: in.Residency,
				Charges: in.Charges, Message: in.LastTransition, Revision: in.Revision, Phase: in.Phase, Placed: a.isPlaced(in.Deployment)}
			j.Why = string(in.Reason) // typed: a server acts on it, never on the text
			if in.LastError != nil {
				j.ErrorCode, j.ErrorMessage, j.ErrorUnixMs = string(in.LastError.Code), in.LastError.Message, in.LastError.At.UnixMilli()
			}
			// The instance as this host's status shows it: the server
			// answers its status from the journals (core/fleet/journalstatus.go).
			is := api.InstanceStatus(&in)
			if a.Placer != nil {
				api.InstanceCharges(a.Placer, &is)
			}
			j.StatusJson, _ = json.Marshal(is)
			out = append(out, j)
		}
	}
	return out
}

// groupSettings are the host role's group settings for its lifecycle; nil
// on other roles (they run no group member).
func (a *Agent) groupSettings() *lifecycle.GroupSettings {
	if a.s.Role != config.RoleHost {
		return nil
	}
	gs := &lifecycle.GroupSettings{RequireRDMA: a.s.RequireRDMA, FirstPort: 25000, LastPort: 25099}
	if a.s.RendezvousPorts != "" {
		if r, err := config.ParsePortRange(a.s.RendezvousPorts); err == nil {
			gs.FirstPort, gs.LastPort = r.First, r.Last
		}
	}
	// IMPORTANT: no default. Group traffic (the rendezvous store, NCCL and
	// Gloo) is unauthenticated: it goes on the link the operator names,
	// never on the interface that happens to reach the server (which may
	// be the one clients and the internet see). A group member on a host
	// without peer_address is refused with peer_address_missing.
	peer := a.s.PeerAddress
	gs.PeerAddress = func() string { return peer }
	return gs
}
