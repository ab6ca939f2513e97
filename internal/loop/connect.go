package loop

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/tlsfault"
)

// ConnectCheckTimeout bounds the connection check at a runner's start.
const ConnectCheckTimeout = 15 * time.Second

// StartChecks are a runner's checks at the start of Run, in one client
// of the options opts that joins nothing (probeClient): its connection
// settings (connectRefused), and, when consumerProtocol, that the cluster
// serves Kafka's consumer group protocol well (consumerProtocolRefused).
// It returns a *eoskit.ConfigError of pkg for a setting no retry cures,
// nil otherwise (a broker down or slow: Run goes on, and retries as it
// does).
func StartChecks(ctx context.Context, pkg string, opts []kgo.Opt, consumerProtocol bool, logger *slog.Logger) error {
	cl, err := probeClient(append(append([]kgo.Opt{}, opts...), kgo.RequestRetries(2)))
	if err != nil {
		return nil // the runner's own client says what is wrong
	}
	defer cl.Close()
	if err := connectRefused(ctx, pkg, cl); err != nil || !consumerProtocol {
		return err
	}
	return consumerProtocolRefused(ctx, pkg, cl, logger)
}

// ConnectError is StartChecks' connection check alone, for a command.
func ConnectError(ctx context.Context, pkg string, opts []kgo.Opt) error {
	return StartChecks(ctx, pkg, opts, false, nil)
}

// connectRefused sends one request to the seed brokers: franz-go retries
// a connection it cannot open for as long as it is asked to, and a runner
// would wait for ever, logging, on a setting no retry cures. It returns a
// *eoskit.ConfigError of pkg naming ClientOptions for those
// (refusedSetting), nil for anything else.
func connectRefused(ctx context.Context, pkg string, cl *kgo.Client) error {
	probe := func() (string, error) {
		ctx, cancel := context.WithTimeout(ctx, ConnectCheckTimeout)
		defer cancel()
		_, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
		return refusedSetting(err), err
	}
	// Refused twice, a few seconds apart: a broker restarting (its
	// credentials not loaded yet, a proxy's alert) refuses only once.
	if reason, _ := probe(); reason == "" || !Sleep(ctx, connectRecheck) {
		return nil
	}
	reason, err := probe()
	if reason == "" {
		return nil
	}
	return &eoskit.ConfigError{Package: pkg, Setting: "ClientOptions", Reason: reason + ": " + err.Error(), Err: err}
}

// connectRecheck is how long connectRefused waits before it asks again
// after a refusal.
const connectRecheck = 2 * time.Second

// refusedSetting says which connection setting err shows wrong, "" when
// err is nil or says nothing of the settings: the broker's certificate not
// trusted or not for the address dialed, the client's refused, TLS against
// a listener without it (or the reverse), credentials refused.
func refusedSetting(err error) string {
	if err == nil {
		return ""
	}
	switch tlsfault.Of(err) {
	case tlsfault.UnknownCA:
		return "the broker's certificate is signed by a CA the client does not trust (give the client that CA: RootCAs in kgo.DialTLSConfig, or eoskit's -tls-ca)"
	case tlsfault.WrongHost:
		return "the broker's certificate is not for the address dialed (dial the name the certificate carries)"
	case tlsfault.Refused:
		return "the broker's certificate was refused"
	}
	var header tls.RecordHeaderError
	switch {
	case errors.As(err, &header):
		return "the listener does not speak TLS (connect without TLS, or to the TLS listener)"
	case errors.Is(err, kerr.SaslAuthenticationFailed):
		return "the broker refused the client's credentials"
	case errors.Is(err, kerr.UnsupportedSaslMechanism), errors.Is(err, kerr.IllegalSaslState):
		return "the broker does not take the client's SASL mechanism"
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "remote error" {
		// The broker's TLS alert: its refusal of the client's
		// certificate (or of none given).
		return "the broker refused the TLS handshake (" + opErr.Err.Error() + "): a client certificate it does not trust, or none where it wants one"
	}
	var firstEOF *kgo.ErrFirstReadEOF
	if errors.As(err, &firstEOF) {
		return "the broker closed the connection at once: TLS against a listener without it (or the reverse), or no SASL where it wants it"
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return "" // a broker down or slow: not a setting
	}
	if msg := err.Error(); strings.Contains(msg, "tls:") {
		return "the TLS handshake failed"
	}
	return ""
}

// probeClient is a client of opts that joins no group: it has one (the
// user's group callbacks and balancers need one to be accepted) but no
// topic, so it sends nothing to a group coordinator, as ReadUserOptions'
// client.
func probeClient(opts []kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(append(append([]kgo.Opt{}, opts...), kgo.ConsumerGroup(probe), kgo.DisableAutoCommit())...)
}
