package errdefs

import (
	"errors"
	"fmt"
	"testing"
)

func TestClassRoundTrip(t *testing.T) {
	for _, name := range Classes() {
		err := fmt.Errorf("sandbox x: %w", FromClass(name))
		if got := Class(err); got != name {
			t.Errorf("Class(FromClass(%q)) = %q", name, got)
		}
	}
	if Class(errors.New("plain")) != "" || FromClass("nonsense") != nil || FromClass("") != nil {
		t.Error("an unclassed error must stay unclassed")
	}
}
