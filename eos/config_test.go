package eos_test

import (
	"context"
	"errors"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
)

// These tests need no broker: franz-go clients connect lazily, and every
// check here happens in a constructor.

func TestPresetsProduceClientsThatPassTheirOwnCheck(t *testing.T) {
	for _, s := range []eos.Semantics{eos.AtMostOnce, eos.AtLeastOnce, eos.ExactlyOnce} {
		t.Run(s.String(), func(t *testing.T) {
			opts := append(append([]kgo.Opt{kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("g")}, s.ProducerOptions()...), s.ConsumerOptions()...)
			cl, err := kgo.NewClient(opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if err := s.Check(cl, eos.RoleProducer, eos.RoleConsumer); err != nil {
				t.Fatalf("preset fails its own check: %v", err)
			}
		})
	}
}

func TestPresetsSetWhatTheSemanticsMean(t *testing.T) {
	tests := []struct {
		s             eos.Semantics
		acks          kgo.Acks
		idempotent    bool
		readCommitted bool
		retries       bool
	}{
		{eos.AtMostOnce, kgo.LeaderAck(), false, false, false},
		{eos.AtLeastOnce, kgo.AllISRAcks(), false, false, true},
		{eos.ExactlyOnce, kgo.AllISRAcks(), true, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.s.String(), func(t *testing.T) {
			opts := append(append([]kgo.Opt{kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("g")}, tt.s.ProducerOptions()...), tt.s.ConsumerOptions()...)
			cl, err := kgo.NewClient(opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if got := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); got != tt.acks {
				t.Errorf("acks = %v, want %v", got, tt.acks)
			}
			if got := !cl.OptValue(kgo.DisableIdempotentWrite).(bool); got != tt.idempotent {
				t.Errorf("idempotent = %v, want %v", got, tt.idempotent)
			}
			if got := cl.OptValue(kgo.FetchIsolationLevel).(int8) == 1; got != tt.readCommitted {
				t.Errorf("read_committed = %v, want %v", got, tt.readCommitted)
			}
			if got := cl.OptValue(kgo.RecordRetries).(int64) > 0; got != tt.retries {
				t.Errorf("retries = %v, want %v", got, tt.retries)
			}
			if !cl.OptValue(kgo.DisableAutoCommit).(bool) {
				t.Error("auto-commit is on; every preset commits offsets itself")
			}
		})
	}
}

func TestCheckRejectsSettingsThatContradictTheSemantics(t *testing.T) {
	tests := []struct {
		name    string
		s       eos.Semantics
		role    eos.Role
		extra   []kgo.Opt
		setting string
	}{
		{"exactly-once with auto-commit", eos.ExactlyOnce, eos.RoleConsumer, []kgo.Opt{kgo.ConsumerGroup("g")}, "DisableAutoCommit"},
		{"exactly-once reading uncommitted", eos.ExactlyOnce, eos.RoleConsumer, []kgo.Opt{kgo.ConsumerGroup("g"), kgo.DisableAutoCommit(), kgo.FetchIsolationLevel(kgo.ReadUncommitted())}, "FetchIsolationLevel"},
		{"exactly-once without idempotence", eos.ExactlyOnce, eos.RoleProducer, []kgo.Opt{kgo.DisableIdempotentWrite()}, "DisableIdempotentWrite"},
		{"at-least-once with leader acks", eos.AtLeastOnce, eos.RoleProducer, []kgo.Opt{kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())}, "RequiredAcks"},
		{"at-least-once without retries", eos.AtLeastOnce, eos.RoleProducer, []kgo.Opt{kgo.RecordRetries(0)}, "RecordRetries"},
		{"at-least-once with auto-commit", eos.AtLeastOnce, eos.RoleConsumer, []kgo.Opt{kgo.ConsumerGroup("g")}, "DisableAutoCommit"},
		{"at-most-once with retries", eos.AtMostOnce, eos.RoleProducer, []kgo.Opt{kgo.DisableIdempotentWrite()}, "RecordRetries"},
		{"at-most-once with a transactional id", eos.AtMostOnce, eos.RoleProducer, []kgo.Opt{kgo.TransactionalID("x")}, "TransactionalID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}, tt.extra...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			err = tt.s.Check(cl, tt.role)
			var cerr *eoskit.ConfigError
			if !errors.As(err, &cerr) || !errors.Is(err, eoskit.ErrInvalidConfig) {
				t.Fatalf("Check = %v, want a *ConfigError wrapping ErrInvalidConfig", err)
			}
			if cerr.Setting != tt.setting || cerr.Semantics != tt.s.String() || cerr.Package != "eos" || cerr.Reason == "" {
				t.Fatalf("Check named %q under %v (%q), want %q under %v with a reason", cerr.Setting, cerr.Semantics, cerr.Reason, tt.setting, tt.s)
			}
			if !strings.Contains(err.Error(), tt.setting) || !strings.Contains(err.Error(), tt.s.String()) {
				t.Fatalf("message %q does not name the setting and the semantics", err)
			}
		})
	}
}

func TestNewProcessorRejectsBadConfig(t *testing.T) {
	h := copyHandler("out")
	base := []eos.ProcessorOption{eos.Brokers("127.0.0.1:1"), eos.Group("g"), eos.Topics("in"), eos.TransactionalID("app-0")}
	with := func(extra ...eos.ProcessorOption) []eos.ProcessorOption {
		return append(append([]eos.ProcessorOption(nil), base...), extra...)
	}
	tests := []struct {
		name    string
		handler eos.HandlerFunc
		opts    []eos.ProcessorOption
		setting string
	}{
		{"no brokers", h, []eos.ProcessorOption{eos.Group("g"), eos.Topics("in"), eos.TransactionalID("x")}, "Brokers"},
		{"no group", h, []eos.ProcessorOption{eos.Brokers("b:1"), eos.Topics("in"), eos.TransactionalID("x")}, "Group"},
		{"no input topics", h, []eos.ProcessorOption{eos.Brokers("b:1"), eos.Group("g"), eos.TransactionalID("x")}, "Topics"},
		{"exactly-once without transactional id", h, []eos.ProcessorOption{eos.Brokers("b:1"), eos.Group("g"), eos.Topics("in")}, "TransactionalID"},
		{"transactional id with at-least-once", h, with(eos.WithSemantics(eos.AtLeastOnce)), "TransactionalID"},
		{"nil handler", nil, base, "handler"},
		{"unknown semantics", h, with(eos.WithSemantics(eos.Semantics(9))), "WithSemantics"},
		{"zero commit interval", h, with(eos.CommitInterval(0)), "CommitInterval"},
		{"commit interval over half the transaction timeout", h, with(eos.CommitInterval(25 * time.Second)), "CommitInterval"},
		{"commit interval over half a shorter transaction timeout", h, with(eos.CommitInterval(3*time.Second), eos.ClientOptions(kgo.TransactionTimeout(5*time.Second))), "CommitInterval"},
		{"zero max records", h, with(eos.MaxRecordsPerCommit(0)), "MaxRecordsPerCommit"},
		// The exactly-once loop never calls AllowRebalance (issue 43
		// item 4; accepted on 3bfa998).
		{"BlockRebalanceOnPoll through ClientOptions", h, with(eos.ClientOptions(kgo.BlockRebalanceOnPoll())), "ClientOptions"},
		// At-most-once commits at poll: a retry would handle the batch's
		// earlier records twice (issue 43 item 5; accepted on 3bfa998).
		{"a Retry under at-most-once", h, []eos.ProcessorOption{eos.Brokers("b:1"), eos.Group("g"), eos.Topics("in"), eos.WithSemantics(eos.AtMostOnce),
			eos.OnHandlerError(eoskit.Classify(eoskit.Stop(), eoskit.When(io.EOF, eoskit.Retry(time.Millisecond, 3))))}, "OnHandlerError"},
		{"dead letter without topic", h, with(eos.OnHandlerError(eos.DeadLetter(""))), "OnHandlerError"},
		{"dead letter into an input topic", h, with(eos.OnHandlerError(eos.DeadLetter("in"))), "OnHandlerError"},
		{"negative retry backoff", h, with(eos.OnHandlerError(eoskit.Retry(-1, 3))), "OnHandlerError"},
		{"negative retry attempts", h, with(eos.OnHandlerError(eoskit.Retry(time.Millisecond, -1))), "OnHandlerError"},
		{"fallback after an endless retry", h, with(eos.OnHandlerError(eoskit.Retry(time.Millisecond, 0).Then(eos.DeadLetter("dlq")))), "OnHandlerError"},
		{"fallback that retries", h, with(eos.OnHandlerError(eoskit.Retry(time.Millisecond, 2).Then(eoskit.Retry(time.Millisecond, 2)))), "OnHandlerError"},
		{"group through ClientOptions", h, with(eos.ClientOptions(kgo.ConsumerGroup("other"))), "ClientOptions"},
		{"topics through ClientOptions", h, with(eos.ClientOptions(kgo.ConsumeTopics("other"))), "ClientOptions"},
		{"transactional id through ClientOptions", h, with(eos.ClientOptions(kgo.TransactionalID("other"))), "ClientOptions"},
		{"fallback on a stop", h, with(eos.OnHandlerError(eoskit.Stop().Then(eos.DeadLetter("dlq")))), "OnHandlerError"},
		{"retry falling back to a dead letter into an input topic", h, with(eos.OnHandlerError(eoskit.Retry(time.Millisecond, 2).Then(eos.DeadLetter("in")))), "OnHandlerError"},
		{"retry falling back to a dead letter without topic", h, with(eos.OnHandlerError(eoskit.Retry(time.Millisecond, 2).Then(eos.DeadLetter("")))), "OnHandlerError"},
		{"a rule dead-lettering into an input topic", h, with(eos.OnHandlerError(eoskit.Classify(eoskit.Stop(), eoskit.When(context.Canceled, eos.DeadLetter("in"))))), "OnHandlerError"},
		{"a rule dead-lettering without topic", h, with(eos.OnHandlerError(eoskit.Classify(eos.DeadLetter("dlq"), eoskit.When(context.Canceled, eos.DeadLetter(""))))), "OnHandlerError"},
		{"a rule with a nil target", h, with(eos.OnHandlerError(eoskit.Classify(eoskit.Stop(), eoskit.When(nil, eos.DeadLetter("dlq"))))), "OnHandlerError"},
		{"a rule with an invalid policy", h, with(eos.OnHandlerError(eoskit.Classify(eoskit.Stop(), eoskit.WhenFunc(func(error) bool { return true }, eoskit.Retry(-1, 2))))), "OnHandlerError"},
		{"a classification as a retry's fallback", h, with(eos.OnHandlerError(eoskit.Retry(time.Millisecond, 2).Then(eoskit.Classify(eoskit.Stop(), eoskit.When(context.Canceled, eos.DeadLetter("dlq")))))), "OnHandlerError"},
		{"acks=leader under exactly-once", h, with(eos.ClientOptions(kgo.RequiredAcks(kgo.LeaderAck()))), "ClientOptions"},
		{"read_uncommitted under exactly-once", h, with(eos.ClientOptions(kgo.FetchIsolationLevel(kgo.ReadUncommitted()))), "FetchIsolationLevel"},
		{"hanging policy under at-least-once", h, []eos.ProcessorOption{eos.Brokers("b:1"), eos.Group("g"), eos.Topics("in"), eos.WithSemantics(eos.AtLeastOnce), eos.OnHangingTransaction(eos.WaitWhenHanging())}, "OnHangingTransaction"},
		{"hanging policy with the check off", h, with(eos.HangingTransactionCheck(0), eos.OnHangingTransaction(eos.RepairHangingTransactions())), "OnHangingTransaction"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := eos.NewProcessor(tt.handler, tt.opts...)
			var cerr *eoskit.ConfigError
			if p != nil || !errors.As(err, &cerr) || !errors.Is(err, eoskit.ErrInvalidConfig) {
				t.Fatalf("NewProcessor = %v, %v; want a *ConfigError", p, err)
			}
			if cerr.Setting != tt.setting {
				t.Fatalf("error names %q (%v), want %q", cerr.Setting, err, tt.setting)
			}
		})
	}
}

// An option given to a constructor that cannot use it does not compile:
// the type each option returns implements the option type of exactly the
// constructors it applies to (read from their signatures).
func TestOptionsCompileOnlyWhereTheyApply(t *testing.T) {
	takes := map[string]reflect.Type{}
	for name, ctor := range map[string]any{"NewIdempotentProducer": eos.NewIdempotentProducer,
		"NewTransactionalProducer": eos.NewTransactionalProducer, "NewProcessor": eos.NewProcessor} {
		ft := reflect.TypeOf(ctor)
		takes[name] = ft.In(ft.NumIn() - 1).Elem()
	}
	all := []string{"NewIdempotentProducer", "NewTransactionalProducer", "NewProcessor"}
	transactions := []string{"NewTransactionalProducer", "NewProcessor"}
	processor := []string{"NewProcessor"}
	for _, tt := range []struct {
		option string
		fn     any
		want   []string
	}{
		{"Brokers", eos.Brokers, all},
		{"Logger", eos.Logger, all},
		{"ClientOptions", eos.ClientOptions, all},
		{"TransactionalID", eos.TransactionalID, transactions},
		{"WithSemantics", eos.WithSemantics, processor},
		{"Group", eos.Group, processor},
		{"Topics", eos.Topics, processor},
		{"CommitInterval", eos.CommitInterval, processor},
		{"MaxRecordsPerCommit", eos.MaxRecordsPerCommit, processor},
		{"OnHandlerError", eos.OnHandlerError, processor},
		{"DrainTimeout", eos.DrainTimeout, processor},
		{"Concurrency", eos.Concurrency, processor},
		{"HangingTransactionCheck", eos.HangingTransactionCheck, processor},
		{"OnHangingTransaction", eos.OnHangingTransaction, processor},
		{"WithMetrics", eos.WithMetrics, processor},
	} {
		out := reflect.TypeOf(tt.fn).Out(0)
		for _, ctor := range all {
			if got, want := out.Implements(takes[ctor]), slices.Contains(tt.want, ctor); got != want {
				t.Errorf("%s (%s) given to %s compiles: %v, want %v", tt.option, out, ctor, got, want)
			}
		}
	}
}

func TestProducersRefuseMissingOrWeakenedSettings(t *testing.T) {
	var cerr *eoskit.ConfigError
	_, err := eos.NewTransactionalProducer(eos.Brokers("b:1"))
	if !errors.As(err, &cerr) || cerr.Setting != "TransactionalID" {
		t.Fatalf("NewTransactionalProducer without id = %v, want a *ConfigError naming TransactionalID", err)
	}
	_, err = eos.NewIdempotentProducer(eos.Logger(nil))
	if !errors.As(err, &cerr) || cerr.Setting != "Brokers" {
		t.Fatalf("NewIdempotentProducer without brokers = %v, want a *ConfigError naming Brokers", err)
	}
	_, err = eos.NewTransactionalProducer(eos.Brokers("b:1"), eos.TransactionalID("x"), eos.ClientOptions(kgo.DisableIdempotentWrite()))
	if !errors.As(err, &cerr) || cerr.Setting != "ClientOptions" {
		t.Fatalf("NewTransactionalProducer without idempotence = %v, want a *ConfigError", err)
	}
}

func TestStableTransactionalID(t *testing.T) {
	id, err := eos.StableTransactionalID("orders-enricher", "2")
	if err != nil || id != "orders-enricher-2" {
		t.Fatalf("StableTransactionalID = %q, %v", id, err)
	}
	for _, bad := range [][2]string{{"", "0"}, {"app", ""}, {"app", "pod 1"}, {"a/b", "0"}} {
		if _, err := eos.StableTransactionalID(bad[0], bad[1]); !errors.Is(err, eoskit.ErrInvalidConfig) {
			t.Errorf("StableTransactionalID(%q, %q) = %v, want ErrInvalidConfig", bad[0], bad[1], err)
		}
	}
}

// Options that are the caller's to set pass through ClientOptions, whatever
// the runner: the check for the options a runner owns must not refuse
// them (a probe with a transactional id refused DisableIdempotentWrite).
func TestClientOptionsTheRunnerDoesNotOwnPass(t *testing.T) {
	h := copyHandler("out")
	_, err := eos.NewProcessor(h, eos.Brokers("127.0.0.1:1"), eos.Group("g"), eos.Topics("in"), eos.WithSemantics(eos.AtLeastOnce),
		eos.ClientOptions(kgo.MaxProduceRequestsInflightPerBroker(5), kgo.ClientID("app"), kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()),
			kgo.OnPartitionsRevoked(func(context.Context, *kgo.Client, map[string][]int32) {})))
	if err != nil {
		t.Fatalf("at-least-once processor with pass-through options: %v", err)
	}
	_, err = eos.NewProcessor(h, eos.Brokers("127.0.0.1:1"), eos.Group("g"), eos.Topics("in"), eos.TransactionalID("app-0"),
		eos.ClientOptions(kgo.ClientID("app"), kgo.SessionTimeout(10*time.Second)))
	if err != nil {
		t.Fatalf("exactly-once processor with pass-through options: %v", err)
	}
}
