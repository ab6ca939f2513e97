// Package tlsfault tells which certificate check of a TLS handshake
// failed, for the connection checks of Kafka (internal/loop) and
// PostgreSQL (internal/pgretry), each of which names the setting to mend
// in its own words.
package tlsfault

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
)

// Fault is the certificate check that failed.
type Fault int

const (
	// None: err shows no certificate check failing.
	None Fault = iota
	// UnknownCA: the peer's certificate is signed by a CA the client
	// does not trust.
	UnknownCA
	// WrongHost: the peer's certificate is not for the host dialed.
	WrongHost
	// Refused: the peer's certificate did not verify otherwise (expired,
	// not for a server).
	Refused
)

// Of returns the certificate check err shows failing.
func Of(err error) Fault {
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	switch {
	case err == nil:
		return None
	case errors.As(err, &unknownCA):
		return UnknownCA
	case errors.As(err, &hostname):
		return WrongHost
	case errors.As(err, &invalid), errors.As(err, &verify):
		return Refused
	}
	return None
}
