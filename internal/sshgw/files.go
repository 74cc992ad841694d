package sshgw

import "os"

// statFile reports whether path is a regular file.
func statFile(path string) (bool, error) {
	st, err := os.Stat(path)
	if err != nil {
		return false, err
	}
	return st.Mode().IsRegular(), nil
}
