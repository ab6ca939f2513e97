package tlsfault

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"testing"
)

// The failed check is told through wrapping, the unknown CA and the wrong
// host before the verification error that carries them.
func TestOfTellsTheFailedCheck(t *testing.T) {
	for _, c := range []struct {
		err  error
		want Fault
	}{
		{nil, None},
		{errors.New("connection refused"), None},
		{fmt.Errorf("dial: %w", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}), UnknownCA},
		{fmt.Errorf("dial: %w", &tls.CertificateVerificationError{Err: x509.HostnameError{Certificate: &x509.Certificate{}, Host: "h"}}), WrongHost},
		{fmt.Errorf("dial: %w", x509.CertificateInvalidError{Reason: x509.Expired}), Refused},
	} {
		if got := Of(c.err); got != c.want {
			t.Errorf("Of(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}
