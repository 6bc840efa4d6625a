// dsinfer command-line interface (placeholder until the generate/logits commands land).
int main() { return 0; }
