package main

import (
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/go-jose/go-jose/v4"
)

// writeJWKS writes the JSON Web Key Set a broker's OAUTHBEARER validator
// trusts: the public half of the RSA key in -key (PKCS#8 PEM, as openssl
// genpkey writes it), for RS256 signatures, under the key id -kid.
func writeJWKS(args []string) error {
	fs := flag.NewFlagSet("jwks", flag.ContinueOnError)
	keyFile := fs.String("key", "", "the signing key (PKCS#8 PEM)")
	kid := fs.String("kid", "", "the key id tokens name in their header")
	out := fs.String("out", "", "where to write the key set")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *keyFile == "" || *kid == "" || *out == "" {
		return errors.New("jwks: -key, -kid and -out are required")
	}
	raw, err := os.ReadFile(*keyFile)
	if err != nil {
		return fmt.Errorf("jwks: %w", err)
	}
	block, _ := pem.Decode(raw)
	if block == nil {
		return fmt.Errorf("jwks: %s holds no PEM block", *keyFile)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return fmt.Errorf("jwks: %s: %w", *keyFile, err)
	}
	if _, ok := key.(*rsa.PrivateKey); !ok {
		return fmt.Errorf("jwks: %s holds a %T, not an RSA key (RS256)", *keyFile, key)
	}
	private := jose.JSONWebKey{Key: key, KeyID: *kid, Algorithm: string(jose.RS256), Use: "sig"}
	pub := private.Public()
	if !pub.Valid() {
		return fmt.Errorf("jwks: %s holds no key a JWKS can carry", *keyFile)
	}
	set, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{pub}})
	if err != nil {
		return fmt.Errorf("jwks: %w", err)
	}
	if err := os.WriteFile(*out, set, 0o644); err != nil {
		return fmt.Errorf("jwks: %w", err)
	}
	return nil
}
