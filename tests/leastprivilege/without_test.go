package leastprivilege_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/testsupport/testbed"
)

// refusedWithout checks one grant missing: with every grant of gs but
// gs[i], run (a fresh run, as user) must return within 30 s an
// *eoskit.AuthorizationError wrapping gs[i].want that names the
// permission (or gs[i].named), and pass also (if not nil: what else the error must
// show); once gs[i] is granted, run must finish (nil) and verify hold.
// Neither an error nor a log line carries user's password.
func refusedWithout(ctx context.Context, t *testing.T, k *integration.KafkaCluster, user testbed.User, gs []grant, i int,
	run func(logs *integration.LogBuffer) error, verify func(), also func(error) error,
) {
	t.Helper()
	missing := gs[i]
	named := missing.name
	if missing.named != "" {
		named = missing.named
	}
	allow(ctx, t, k.Admin, append(append([]grant{}, gs[:i]...), gs[i+1:]...)...)
	logs := &integration.LogBuffer{}
	start := time.Now()
	err := run(logs)
	took := time.Since(start)
	switch {
	case err == nil:
		t.Fatalf("without %s, Run did everything", missing.name)
	case !errors.As(err, new(*eoskit.AuthorizationError)) || !errors.Is(err, missing.want) || !strings.Contains(err.Error(), named):
		t.Fatalf("without %s, Run returned %v; want an *eoskit.AuthorizationError wrapping %v that names %q; logs:\n%s", missing.name, err, missing.want, named, logs)
	case took > 30*time.Second:
		t.Fatalf("without %s, Run took %s to return %v; want it within 30 s", missing.name, took, err)
	}
	if also != nil {
		if why := also(err); why != nil {
			t.Fatalf("without %s, Run returned %v: %v", missing.name, err, why)
		}
	}
	t.Logf("without %s: %v (%s)", missing.name, err, took.Round(time.Millisecond))
	noSecret(t, user.Password, err.Error())
	allow(ctx, t, k.Admin, missing)
	if err := run(logs); err != nil {
		t.Fatalf("once %s was granted, Run returned %v", missing.name, err)
	}
	verify()
	noSecret(t, user.Password, logs.String())
}
