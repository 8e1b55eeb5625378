// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Command controller is the example of the controller guide
// (website/content/guides/controller.md): a program that drives a CapyCTL
// role through the management API alone. It creates a deployment under an
// idempotency key, starts it, follows the event stream from a snapshot's
// cursor, writes a new revision, parks, stops and deletes it, retrying
// what the API says is retryable.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/capyctl/capyctl/core/api/client"
	"github.com/capyctl/capyctl/core/api/wire"
)

func main() {
	home, _ := os.UserHomeDir()
	stateDir := flag.String("state-dir", filepath.Join(home, ".local", "state", "capyctl"), "the role's state directory (for the admin token)")
	addr := flag.String("addr", "127.0.0.1:7443", "the management API's address")
	name := flag.String("name", "ctl-demo", "the deployment to manage")
	engine := flag.String("engine", "llamacpp", "a registered engine")
	model := flag.String("model", "qwen2.5-0.5b", "the model, under the models root")
	flag.Parse()

	creds, err := client.ReadCredentials(*stateDir)
	if err != nil {
		log.Fatalf("read the admin token: %v", err)
	}
	c := client.New(*addr, creds.AdminToken)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := run(ctx, c, *name, *engine, *model, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// retry calls f until it succeeds, fails with an error that is not
// retryable, or ctx ends. A mutation retried here carries the same
// idempotency key each time, so it is carried out at most once.
func retry[T any](ctx context.Context, f func() (T, error)) (T, error) {
	wait := 100 * time.Millisecond
	for {
		v, err := f()
		if err == nil || !client.Retryable(err) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, errors.Join(err, ctx.Err())
		case <-time.After(wait):
		}
		if wait < 5*time.Second {
			wait *= 2
		}
	}
}

// run drives one deployment through its whole life.
func run(ctx context.Context, c *client.Client, name, engine, model string, out *os.File) error {
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }

	// 1. The snapshot: the state now, and the cursor to follow from.
	snap, err := retry(ctx, func() (*wire.Snapshot, error) { return c.Snapshot(ctx) })
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	say("role %s %s on %s, %d deployments, cursor %s", snap.Role.Role, snap.Role.Version, snap.Role.Host, len(snap.Deployments), snap.Cursor)

	// 2. Follow the events from that cursor in the background.
	events := make(chan *wire.Event, 64)
	fctx, stopFollowing := context.WithCancel(ctx)
	defer stopFollowing()
	go func() {
		err := c.Follow(fctx, snap.Cursor, func(ev *wire.Event) error {
			if ev.Deployment == name {
				events <- ev
			}
			return nil
		})
		if client.IsCursorExpired(err) {
			// Too far behind: a real controller takes a new snapshot and
			// follows from its cursor.
			say("cursor expired: take a new snapshot")
		}
	}()
	waitFor := func(kind string) error {
		for {
			select {
			case ev := <-events:
				say("event %s %s %s", ev.Cursor, ev.Kind, ev.Instance)
				if ev.Kind == kind {
					return nil
				}
			case <-ctx.Done():
				return fmt.Errorf("waiting for %s: %w", kind, ctx.Err())
			}
		}
	}

	// 3. Create, under a key kept for retries.
	doc, _ := json.Marshal(map[string]any{"name": name, "engine": engine, "model": map[string]string{"path": model}})
	key := client.NewIdempotencyKey()
	created, err := retry(ctx, func() (*wire.DeployAccepted, error) { return c.DeployDocument(ctx, doc, false, 0, key) })
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	say("created %s revision %d", created.Name, created.Revision)
	if err := waitFor("deployment_created"); err != nil {
		return err
	}

	// 4. Start it and wait until it serves; the controller owns every start.
	startKey := client.NewIdempotencyKey()
	if _, err := retry(ctx, func() (*wire.ActionAccepted, error) {
		return c.Action(ctx, name, wire.ActionRequest{Action: wire.ActionStart, Wait: true, ExpectedRevision: created.Revision}, client.WithIdempotencyKey(startKey))
	}); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	if err := waitFor("instance_ready"); err != nil {
		return err
	}

	// 5. A new revision names the one it replaces.
	doc2, _ := json.Marshal(map[string]any{"name": name, "engine": engine, "request_deadline": "120s", "model": map[string]string{"path": model}})
	reviseKey := client.NewIdempotencyKey()
	revised, err := retry(ctx, func() (*wire.DeployAccepted, error) {
		return c.DeployDocument(ctx, doc2, true, created.Revision, reviseKey)
	})
	if err != nil {
		return fmt.Errorf("revise: %w", err)
	}
	say("revision %d replaces %d", revised.Revision, created.Revision)
	if err := waitFor("deployment_revised"); err != nil {
		return err
	}

	// 6. Park it (a restart-only engine is stopped instead), stop it,
	// delete it.
	for _, action := range []string{wire.ActionPark, wire.ActionStop} {
		k := client.NewIdempotencyKey()
		if _, err := retry(ctx, func() (*wire.ActionAccepted, error) {
			return c.Action(ctx, name, wire.ActionRequest{Action: action, Wait: true}, client.WithIdempotencyKey(k))
		}); err != nil {
			return fmt.Errorf("%s: %w", action, err)
		}
		st, err := c.Deployment(ctx, name)
		if err != nil {
			return err
		}
		say("after %s: %s", action, st.State)
	}
	delKey := client.NewIdempotencyKey()
	if _, err := retry(ctx, func() (struct{}, error) { return struct{}{}, c.Delete(ctx, name, client.WithIdempotencyKey(delKey)) }); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	if err := waitFor("deployment_deleted"); err != nil {
		return err
	}
	say("deleted %s", name)
	return nil
}
