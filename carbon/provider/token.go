package provider

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// ErrNoToken means neither the environment variable nor the file gave a token.
var ErrNoToken = errors.New("provider: no token")

// TokenFromEnvOrFile returns a secret from the environment variable envName if it is set and
// non-empty, else from the file fileName (surrounding whitespace trimmed). Secrets never come
// from flags, which any user can read in ps. Empty names are skipped.
func TokenFromEnvOrFile(envName, fileName string) (string, error) {
	if envName != "" {
		if v := strings.TrimSpace(os.Getenv(envName)); v != "" {
			return v, nil
		}
	}
	if fileName != "" {
		b, err := os.ReadFile(fileName)
		if err != nil {
			return "", fmt.Errorf("provider: reading token file: %w", err)
		}
		if v := strings.TrimSpace(string(b)); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("%w: token file %s is empty", ErrNoToken, fileName)
	}
	return "", fmt.Errorf("%w: set %s or give a token file", ErrNoToken, envName)
}
