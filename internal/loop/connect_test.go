package loop

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
)

// A connection setting no retry cures is named; a broker down or slow is
// not a setting.
func TestRefusedSetting(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		refused bool
	}{
		{"none", nil, false},
		{"unknown CA", fmt.Errorf("unable to dial: %w", x509.UnknownAuthorityError{}), true},
		{"host name", fmt.Errorf("unable to dial: %w", x509.HostnameError{Host: "10.0.0.1"}), true},
		{"credentials", fmt.Errorf("broker 1: %w", kerr.SaslAuthenticationFailed), true},
		{"mechanism", kerr.UnsupportedSaslMechanism, true},
		{"connection refused", fmt.Errorf("unable to dial: %w", &net.OpError{Op: "dial", Err: errors.New("connection refused")}), false},
		{"timeout", context.DeadlineExceeded, false},
	} {
		if got := refusedSetting(tc.err) != ""; got != tc.refused {
			t.Errorf("%s: refused %v, want %v (%q)", tc.name, got, tc.refused, refusedSetting(tc.err))
		}
	}
}
